package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
)

// Agent sessions are the agent service's (pkg/services/agents); the engine
// keeps AgentRun as the front ends' facade, gives the service its narrow
// views of the engine (agentDeps), and keeps the autofix provider "agent",
// which runs a session per fix.

type (
	AgentRunRequest = apitypes.AgentRunRequest
	AgentRunResult  = apitypes.AgentRunResult
	AgentProgress   = apitypes.AgentProgress
)

const (
	// AgentCredential is the credential (network.credentials) agent
	// sessions are granted: the Messages API.
	AgentCredential = agents.AgentCredential
	// AgentImage is the default image of agent sessions.
	AgentImage = agents.AgentImage
)

// AgentRun runs one agent session; progress, if not nil, sees the session
// start, tool calls, changed files and the result as they stream.
func (e *Engine) AgentRun(ctx context.Context, req AgentRunRequest, progress func(AgentProgress)) (*AgentRunResult, error) {
	return e.agents.Run(ctx, req, progress)
}

// agentDeps is the engine as the agent service sees it: the validated
// sandbox and file operations, the manager's lookup and exec, run records
// and credential usage.
type agentDeps struct{ e *Engine }

func (d agentDeps) CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	return d.e.CreateSandbox(ctx, req)
}

func (d agentDeps) TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	return d.e.TerminateSandbox(ctx, id)
}

func (d agentDeps) WriteFile(ctx context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error) {
	return d.e.WriteFile(ctx, req)
}

func (d agentDeps) ReadFile(ctx context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error) {
	return d.e.ReadFile(ctx, req)
}

func (d agentDeps) ListFiles(ctx context.Context, id, p string, recursive bool) ([]apitypes.FileEntry, error) {
	return d.e.ListFiles(ctx, id, p, recursive)
}

func (d agentDeps) Get(ctx context.Context, id string) (*sandbox.Info, error) {
	return d.e.sandboxes.Get(ctx, id)
}

func (d agentDeps) Exec(ctx context.Context, id string, spec sandbox.ExecSpec, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	return d.e.sandboxes.Exec(ctx, id, spec, onOutput)
}

func (d agentDeps) New() (*runs.Record, error) { return d.e.newRunRecord() }

func (d agentDeps) ContainerInfo(info *sandbox.Info, ephemeral bool) map[string]any {
	return containerInfo(info, ephemeral)
}

func (d agentDeps) Finish(ctx context.Context, r *runs.Record, m *runs.Metadata) error {
	return d.e.runs.Finish(ctx, r, m)
}

func (d agentDeps) AgentCredential() bool {
	return d.e.net != nil && d.e.netCfg.Credentials[AgentCredential].BaseURL != nil
}

func (d agentDeps) Usage(id, credential string) (network.CredentialUsage, bool) {
	if d.e.net == nil {
		return network.CredentialUsage{}, false
	}
	u, ok := d.e.net.CredentialUsage(id)[credential]
	return u, ok
}

// agentFixProvider is the autofix provider "agent": one fix = one agent
// session in the loop's own sandbox (the agent image, granted the
// credential), with the failure as its prompt. The session edits the
// files in place; its answer is the files it left, and the loop's success
// rule judges the next attempt as with any provider.
type agentFixProvider struct {
	e         *Engine
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
	res, err := p.e.AgentRun(ctx, AgentRunRequest{Prompt: prompt, SandboxID: p.sandboxID, MaxTurns: p.maxTurns, TimeoutSeconds: timeout.Seconds()}, nil)
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
