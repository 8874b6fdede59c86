package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// AgentLine is one line of the agent_run stream (POST
// /v1/agent/run?stream=true): a progress event, the result, or the error
// that ended the session.
type AgentLine struct {
	Progress *apitypes.AgentProgress  `json:"progress,omitempty"`
	Result   *apitypes.AgentRunResult `json:"result,omitempty"`
	Error    *ErrorBody               `json:"error,omitempty"`
}

// AgentRun runs an agent session (POST /v1/agent/run?stream=true) and
// waits for it; onProgress, if not nil, sees each event (started,
// tool_call, file_changed, text, result) as the session streams it.
func (c *Client) AgentRun(ctx context.Context, req apitypes.AgentRunRequest, onProgress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error) {
	resp, err := c.send(ctx, http.MethodPost, "/v1/agent/run", url.Values{"stream": {"true"}}, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var line AgentLine
		if err := readLine(dec, "agent_run", &line); err != nil {
			return nil, err
		}
		switch {
		case line.Error != nil:
			return nil, line.Error.Err()
		case line.Result != nil:
			return line.Result, nil
		case line.Progress != nil && onProgress != nil:
			onProgress(*line.Progress)
		}
	}
}
