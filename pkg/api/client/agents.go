package client

import (
	"context"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// AgentRun runs an agent session (POST /v1/agent/run) and waits for it.
func (c *Client) AgentRun(ctx context.Context, req apitypes.AgentRunRequest) (*apitypes.AgentRunResult, error) {
	var res apitypes.AgentRunResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/agent/run", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
