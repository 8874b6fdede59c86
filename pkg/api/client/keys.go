package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// CreateKey makes an API key; the answer's Secret is shown once.
func (c *Client) CreateKey(ctx context.Context, req apitypes.KeyCreateRequest) (*apitypes.KeySecret, error) {
	var out apitypes.KeySecret
	return &out, c.doJSON(ctx, http.MethodPost, "/v1/keys", nil, req, &out)
}

// Keys lists the API keys.
func (c *Client) Keys(ctx context.Context) ([]apitypes.Key, error) {
	var out apitypes.KeyList
	return out.Keys, c.doJSON(ctx, http.MethodGet, "/v1/keys", nil, nil, &out)
}

// RevokeKey revokes key id.
func (c *Client) RevokeKey(ctx context.Context, id string) (*apitypes.Key, error) {
	var out apitypes.Key
	return &out, c.doJSON(ctx, http.MethodPost, "/v1/keys/"+url.PathEscape(id)+"/revoke", nil, nil, &out)
}

// RotateKey gives key id a new secret.
func (c *Client) RotateKey(ctx context.Context, id string) (*apitypes.KeySecret, error) {
	var out apitypes.KeySecret
	return &out, c.doJSON(ctx, http.MethodPost, "/v1/keys/"+url.PathEscape(id)+"/rotate", nil, nil, &out)
}

// KeyUsage is key id's quota and use ("" or "self": the caller's own key).
func (c *Client) KeyUsage(ctx context.Context, id string) (*apitypes.KeyUsage, error) {
	if id == "" {
		id = "self"
	}
	var out apitypes.KeyUsage
	return &out, c.doJSON(ctx, http.MethodGet, "/v1/keys/"+url.PathEscape(id)+"/usage", nil, nil, &out)
}
