package fixloop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
)

// agentFixProvider is the autofix provider "agent": one fix = one agent
// session in the loop's own sandbox (the agent image, granted the
// credential), with the failure as its prompt. The session edits the
// files in place; its answer is the files it left, and the loop's success
// rule judges the next attempt as with any provider.
type agentFixProvider struct {
	agents    Agents
	sandboxID string // the loop's sandbox, set once it exists
	maxTurns  int
}

func (p *agentFixProvider) Name() string { return apitypes.ProviderAgent }

func (p *agentFixProvider) Fix(ctx context.Context, req *autofix.FixRequest) (*autofix.Answer, error) {
	if p.sandboxID == "" {
		return nil, errors.New("the loop has no sandbox")
	}
	timeout := agents.DefaultTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= time.Second {
		return nil, context.DeadlineExceeded
	}
	prompt := req.Prompt() + "\n\nFix the project's files in /workspace in place (edit them; do not only explain), then run the failing step again to check."
	res, err := p.agents.Run(ctx, apitypes.AgentRunRequest{Prompt: prompt, SandboxID: p.sandboxID, MaxTurns: p.maxTurns, TimeoutSeconds: timeout.Seconds()}, nil)
	if err != nil {
		return nil, err
	}
	if !res.Success && strings.HasPrefix(res.Cause, "spend_cap") {
		return nil, fmt.Errorf("agent session stopped: %s (transcript %s)", res.Cause, res.Transcript)
	}
	files := map[string]string{}
	for p := range req.Files {
		if c, ok := res.Files[p]; ok {
			files[p] = c
		}
	}
	for _, ch := range res.Changes {
		if c, ok := res.Files[ch.Path]; ok && ch.Status != "deleted" {
			files[ch.Path] = c
		}
	}
	return &autofix.Answer{Files: files, Usage: &apitypes.TokenUsage{InputTokens: res.Usage.InputTokens, OutputTokens: res.Usage.OutputTokens}}, nil
}
