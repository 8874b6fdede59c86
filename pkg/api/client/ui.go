package client

import (
	"context"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// LoginURL is a one-time login URL of the web editor.
type LoginURL = apitypes.LoginURL

// MintLoginURL asks for a one-time web editor login URL
// (POST /v1/ui/login-tokens; the socket or the bearer token).
func (c *Client) MintLoginURL(ctx context.Context) (*LoginURL, error) {
	var l LoginURL
	return &l, c.doJSON(ctx, http.MethodPost, "/v1/ui/login-tokens", nil, nil, &l, http.StatusCreated)
}
