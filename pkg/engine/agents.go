package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
)

// Agent sessions are the agent service's (pkg/services/agents); the engine
// keeps AgentRun as the front ends' facade, gives the service its narrow
// views of the engine (agentDeps). The autofix provider "agent", which
// runs a session per fix, is the autofix service's (pkg/services/fixloop).

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

func (d agentDeps) New() (*runs.Record, error) { return d.e.pipeline.NewRecord() }

func (d agentDeps) ContainerInfo(info *sandbox.Info, ephemeral bool) map[string]any {
	return pipeline.ContainerInfo(info, ephemeral)
}

func (d agentDeps) Finish(ctx context.Context, r *runs.Record, m *runs.Metadata) error {
	return d.e.pipeline.FinishRecord(ctx, r, m)
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
