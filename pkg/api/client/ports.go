package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// PortExposure is a sandbox port served by the daemon's preview listener.
type PortExposure = apitypes.PortExposure

// ExposePort serves a sandbox's port on the preview listener
// (POST /v1/sandboxes/{id}/ports).
func (c *Client) ExposePort(ctx context.Context, id string, port int) (*PortExposure, error) {
	var x PortExposure
	return &x, c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/ports"), nil, apitypes.ExposePortRequest{Port: port}, &x)
}

// Ports lists a sandbox's exposed ports (GET /v1/sandboxes/{id}/ports).
func (c *Client) Ports(ctx context.Context, id string) ([]PortExposure, error) {
	var out struct {
		Ports []PortExposure `json:"ports"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/ports"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Ports, nil
}

// UnexposePort ends an exposure (DELETE /v1/sandboxes/{id}/ports/{port}).
func (c *Client) UnexposePort(ctx context.Context, id string, port int) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "/ports/"+strconv.Itoa(port)), nil, nil, nil)
}
