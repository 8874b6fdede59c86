package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Lifecycle webhook tools (pkg/services/webhooks, docs/webhooks.md), over
// the service's own interface (Options.Webhooks): webhook_create,
// webhook_list, webhook_get, webhook_update, webhook_delete,
// webhook_deliveries, webhook_redeliver.

type webhookIDIn struct {
	WebhookID string `json:"webhook_id" jsonschema:"required" jsonschema_description:"The webhook's id (wh_...), from webhook_create or webhook_list."`
}

type webhookDeliveriesIn struct {
	WebhookID string `json:"webhook_id" jsonschema:"required" jsonschema_description:"The webhook's id."`
	Limit     int    `json:"limit,omitempty" jsonschema_description:"Most deliveries to list, newest first (default 50, at most 500)."`
}

type webhookRedeliverIn struct {
	WebhookID  string `json:"webhook_id" jsonschema:"required" jsonschema_description:"The webhook's id."`
	DeliveryID string `json:"delivery_id" jsonschema:"required" jsonschema_description:"The delivery's id (msg_...), from webhook_deliveries."`
}

// webhookDeleteOut is webhook_delete's answer.
type webhookDeleteOut struct {
	WebhookID string `json:"webhook_id"`
	Deleted   bool   `json:"deleted"`
}

func (s *srv) addWebhookTools() {
	w := s.opt.Webhooks
	events := strings.Join(apitypes.WebhookEventTypes, ", ")
	addTool[apitypes.WebhookCreateRequest, apitypes.Webhook](s, "webhook_create", "Register a webhook",
		joinLines(
			"Register a URL (http or https) to which the server POSTs lifecycle events of your tenant's sandboxes, runs and autofix loops, signed as Standard Webhooks says (headers webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>).",
			"events: any of "+events+" (empty: all). timeout_ms bounds one attempt (1000 to 30000, default 10000). Failed deliveries are retried with backoff; many failures in a row disable the webhook.",
			"The answer holds the signing secret (whsec_...) this once: keep it. A private, loopback or link-local address is refused unless the administrator allows it.",
		),
		annotations{},
		func(ctx context.Context, c *call, in *apitypes.WebhookCreateRequest) (*result, error) {
			h, err := w.CreateWebhook(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: *h, text: fmt.Sprintf("webhook %s registered for %s; secret %s (shown once)", h.ID, h.URL, h.Secret)}, nil
		})
	addTool[struct{}, apitypes.WebhookList](s, "webhook_list", "List webhooks",
		"List your tenant's webhooks with their state (enabled or disabled, and why) and failures in a row. Secrets are not shown.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *struct{}) (*result, error) {
			l, err := w.ListWebhooks(ctx)
			if err != nil {
				return nil, err
			}
			return &result{structured: *l, text: fmt.Sprintf("%d webhooks", len(l.Webhooks))}, nil
		})
	addTool[webhookIDIn, apitypes.Webhook](s, "webhook_get", "Show a webhook",
		"Show one webhook: URL, events, state and disabled_reason, failures in a row, timeout.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *webhookIDIn) (*result, error) {
			h, err := w.GetWebhook(ctx, in.WebhookID)
			if err != nil {
				return nil, err
			}
			return &result{structured: *h, text: fmt.Sprintf("webhook %s %s: %s", h.ID, h.State, h.URL)}, nil
		})
	addTool[apitypes.WebhookUpdateRequest, apitypes.Webhook](s, "webhook_update", "Change a webhook",
		"Change the fields given: name, url, events, timeout_ms, enabled. enabled true re-enables a webhook its failures disabled (its pending deliveries resume); false disables it.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.WebhookUpdateRequest) (*result, error) {
			h, err := w.UpdateWebhook(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: *h, text: fmt.Sprintf("webhook %s %s: %s", h.ID, h.State, h.URL)}, nil
		})
	addTool[webhookIDIn, webhookDeleteOut](s, "webhook_delete", "Delete a webhook",
		"Delete a webhook and its delivery log; its pending deliveries are dropped.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *webhookIDIn) (*result, error) {
			if err := w.DeleteWebhook(ctx, in.WebhookID); err != nil {
				return nil, err
			}
			return &result{structured: webhookDeleteOut{WebhookID: in.WebhookID, Deleted: true}, text: "deleted webhook " + in.WebhookID}, nil
		})
	addTool[webhookDeliveriesIn, apitypes.WebhookDeliveryList](s, "webhook_deliveries", "List a webhook's deliveries",
		"List a webhook's deliveries, newest first: event type, state (pending, delivered, failed), attempts, the last HTTP status or error, the payload.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *webhookDeliveriesIn) (*result, error) {
			l, err := w.ListDeliveries(ctx, in.WebhookID, in.Limit)
			if err != nil {
				return nil, err
			}
			return &result{structured: *l, text: fmt.Sprintf("%d deliveries", len(l.Deliveries))}, nil
		})
	addTool[webhookRedeliverIn, apitypes.WebhookDelivery](s, "webhook_redeliver", "Redeliver a delivery",
		"Queue a delivered or failed delivery again, now, with the same webhook-id (receivers deduplicate on it).",
		annotations{},
		func(ctx context.Context, c *call, in *webhookRedeliverIn) (*result, error) {
			d, err := w.Redeliver(ctx, in.WebhookID, in.DeliveryID)
			if err != nil {
				return nil, err
			}
			return &result{structured: *d, text: "queued " + d.ID + " again"}, nil
		})
}
