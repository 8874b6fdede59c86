package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// maxAgentDiffText bounds the diff in agent_run's text content.
const maxAgentDiffText = 32 << 10

func (s *srv) addAgentTools() {
	addTool[apitypes.AgentRunRequest, apitypes.AgentRunResult](s, "agent_run", "Run a coding agent in a sandbox",
		joinLines(
			"Run a coding agent (Claude Code in print mode) on files in a fresh sandbox of the agent image: it reads the prompt, edits files and runs commands there, and the tool returns its summary, the final files under /workspace with what changed (added/modified/deleted) and the unified diff of the text files, token usage, num_turns, success and a cause when it failed (max_turns, timeout, spend_cap: ..., agent_error), the session's run record (run_id; run_get shows its progress log) and the path of its transcript (the CLI's stream-json lines) in that record on the server.",
			"The API key never enters the sandbox: the sandbox reaches only the server's credential proxy, which adds the key (server configuration network.credentials.anthropic) and enforces the spend caps. With a progress token, the session's start (run_id, sandbox), tool calls, changed files and the result are sent as progress notifications, one line each.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.AgentRunRequest) (*result, error) {
			out := c.progress.outputFunc()
			res, err := s.e.AgentRun(ctx, *in, func(p apitypes.AgentProgress) {
				if out != nil && p.Kind != "text" {
					out("stdout", []byte(p.String()+"\n"))
				}
			})
			if err != nil {
				return nil, err
			}
			var b strings.Builder
			fmt.Fprintf(&b, "success: %v %s\nturns: %d, requests: %d, tokens: %d in / %d out\n", res.Success, res.Cause, res.NumTurns, res.Usage.Requests, res.Usage.InputTokens, res.Usage.OutputTokens)
			for _, ch := range res.Changes {
				fmt.Fprintf(&b, "%s %s\n", ch.Status, ch.Path)
			}
			fmt.Fprintf(&b, "summary: %s\n", res.Summary)
			if d := res.Diff; d != "" {
				if len(d) > maxAgentDiffText {
					d = d[:maxAgentDiffText] + "\n… (cut; the structured result has the whole diff)\n"
				}
				fmt.Fprintf(&b, "diff:\n%s", d)
			}
			return &result{structured: res, text: b.String()}, nil
		})
}
