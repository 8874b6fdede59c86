package client

import (
	"context"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// AgentLine is one line of the agent_run stream (POST
// /v1/agent/run?stream=true): a progress event, the result, or the error
// that ended the session.
type AgentLine = apitypes.AgentLine

// AgentRun runs an agent session (POST /v1/agent/run?stream=true) and
// waits for it; onProgress, if not nil, sees each event (started,
// tool_call, file_changed, text, result) as the session streams it.
func (c *Client) AgentRun(ctx context.Context, req apitypes.AgentRunRequest, onProgress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error) {
	return postStream(ctx, c, "/v1/agent/run", url.Values{"stream": {"true"}}, req, "agent_run", func(line *AgentLine) (bool, *apitypes.AgentRunResult, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Result != nil:
			return true, line.Result, nil
		case line.Progress != nil && onProgress != nil:
			onProgress(*line.Progress)
		}
		return false, nil, nil
	})
}
