package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
)

// Agent sessions are the agent service's (pkg/services/agents); the engine
// keeps AgentRun as the front ends' facade and gives the service the
// credential proxy (credentials); services.Compose wires the rest. The
// autofix provider "agent", which runs a session per fix, is the autofix
// service's (pkg/services/fixloop).

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

// credentials is the network's credential proxy as agent sessions see it
// (agents.Credentials).
type credentials struct{ e *Engine }

func (d credentials) AgentCredential() bool {
	return d.e.net != nil && d.e.netCfg.Credentials[AgentCredential].BaseURL != nil
}

func (d credentials) Usage(id, credential string) (network.CredentialUsage, bool) {
	if d.e.net == nil {
		return network.CredentialUsage{}, false
	}
	u, ok := d.e.net.CredentialUsage(id)[credential]
	return u, ok
}
