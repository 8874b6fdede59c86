package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Volume is a named volume.
type Volume = apitypes.Volume

// CreateVolume makes a named volume.
func (c *Client) CreateVolume(ctx context.Context, req apitypes.VolumeCreateRequest) (*Volume, error) {
	var v Volume
	return &v, c.doJSON(ctx, http.MethodPost, "/v1/volumes", nil, req, &v)
}

// Volumes lists the named volumes.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var l apitypes.VolumeList
	return l.Volumes, c.doJSON(ctx, http.MethodGet, "/v1/volumes", nil, nil, &l)
}

// GetVolume describes one volume.
func (c *Client) GetVolume(ctx context.Context, name string) (*Volume, error) {
	var v Volume
	return &v, c.doJSON(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(name), nil, nil, &v)
}

// DeleteVolume deletes a volume and its files.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(name), nil, nil, nil)
}
