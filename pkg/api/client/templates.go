package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Template is a sandbox template.
type Template = apitypes.Template

// CreateTemplate stores a template.
func (c *Client) CreateTemplate(ctx context.Context, req apitypes.TemplateCreateRequest) (*Template, error) {
	var t Template
	return &t, c.doJSON(ctx, http.MethodPost, "/v1/templates", nil, req, &t)
}

// Templates lists the templates.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var l apitypes.TemplateList
	return l.Templates, c.doJSON(ctx, http.MethodGet, "/v1/templates", nil, nil, &l)
}

// GetTemplate describes one template.
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	var t Template
	return &t, c.doJSON(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, nil, &t)
}

// DeleteTemplate deletes a template (and its warm sandboxes).
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}
