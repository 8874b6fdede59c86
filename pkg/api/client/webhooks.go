package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Lifecycle webhooks (/v1/webhooks, docs/webhooks.md).

func webhookPath(id string, rest string) string { return "/v1/webhooks/" + url.PathEscape(id) + rest }

// CreateWebhook registers a webhook (POST /v1/webhooks); the answer holds
// its secret, shown this once.
func (c *Client) CreateWebhook(ctx context.Context, req apitypes.WebhookCreateRequest) (*apitypes.Webhook, error) {
	var w apitypes.Webhook
	return &w, c.doJSON(ctx, http.MethodPost, "/v1/webhooks", nil, req, &w, http.StatusCreated)
}

// Webhooks lists the caller's webhooks (GET /v1/webhooks).
func (c *Client) Webhooks(ctx context.Context) ([]apitypes.Webhook, error) {
	var l apitypes.WebhookList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/webhooks", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Webhooks, nil
}

// Webhook returns one webhook (GET /v1/webhooks/{id}).
func (c *Client) Webhook(ctx context.Context, id string) (*apitypes.Webhook, error) {
	var w apitypes.Webhook
	return &w, c.doJSON(ctx, http.MethodGet, webhookPath(id, ""), nil, nil, &w)
}

// UpdateWebhook changes the fields req sets (PATCH /v1/webhooks/{id}).
func (c *Client) UpdateWebhook(ctx context.Context, req apitypes.WebhookUpdateRequest) (*apitypes.Webhook, error) {
	var w apitypes.Webhook
	return &w, c.doJSON(ctx, http.MethodPatch, webhookPath(req.ID, ""), nil, req, &w)
}

// DeleteWebhook removes a webhook (DELETE /v1/webhooks/{id}).
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, webhookPath(id, ""), nil, nil, nil, http.StatusNoContent)
}

// WebhookDeliveries lists a webhook's deliveries, newest first
// (GET /v1/webhooks/{id}/deliveries); limit 0 is the server's default.
func (c *Client) WebhookDeliveries(ctx context.Context, id string, limit int) ([]apitypes.WebhookDelivery, error) {
	var q url.Values
	if limit != 0 {
		q = url.Values{"limit": {strconv.Itoa(limit)}}
	}
	var l apitypes.WebhookDeliveryList
	if err := c.doJSON(ctx, http.MethodGet, webhookPath(id, "/deliveries"), q, nil, &l); err != nil {
		return nil, err
	}
	return l.Deliveries, nil
}

// RedeliverWebhook queues a delivery again
// (POST /v1/webhooks/{id}/deliveries/{delivery}/redeliver).
func (c *Client) RedeliverWebhook(ctx context.Context, id, delivery string) (*apitypes.WebhookDelivery, error) {
	var d apitypes.WebhookDelivery
	return &d, c.doJSON(ctx, http.MethodPost, webhookPath(id, "/deliveries/"+url.PathEscape(delivery)+"/redeliver"), nil, nil, &d, http.StatusAccepted)
}
