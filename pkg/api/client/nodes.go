package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Types of the fleet routes.
type (
	NodeStatus    = apitypes.NodeStatus
	FleetNodeList = apitypes.FleetNodeList
)

// Nodes lists a gateway's nodes with their capacity (GET /v1/nodes on a
// gateway; admin only).
func (c *Client) Nodes(ctx context.Context) (*FleetNodeList, error) {
	var l FleetNodeList
	return &l, c.doJSON(ctx, http.MethodGet, "/v1/nodes", nil, nil, &l)
}

// DrainNode starts (draining true) or ends a drain of node name through a
// gateway (PUT /v1/nodes/{name}/drain; admin only).
func (c *Client) DrainNode(ctx context.Context, name string, draining bool) (*NodeStatus, error) {
	var st NodeStatus
	return &st, c.doJSON(ctx, http.MethodPut, "/v1/nodes/"+url.PathEscape(name)+"/drain", nil, apitypes.NodeDrainRequest{Draining: draining}, &st)
}
