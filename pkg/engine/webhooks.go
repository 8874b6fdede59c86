package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
)

// Lifecycle webhooks (pkg/services/webhooks). The front ends take the
// service's own interface (Webhooks); the engine only wires it and
// announces, at the sandbox manager's one seam, the events that happen
// outside the manager: a run finished, a quota reached, the node drained.

// Webhooks is the lifecycle webhook service, for the front ends.
func (e *Engine) Webhooks() webhooks.Webhooks { return e.webhooks }

// tenantOf is the tenant ctx's caller acts for ("" for the administrator
// and engine-internal calls).
func tenantOf(ctx context.Context) string {
	p, _ := principal.From(ctx)
	return p.Tenant
}

// announceRun announces a finished run.
func (e *Engine) announceRun(ctx context.Context, res *apitypes.RunResult) {
	e.sandboxes.Announce(apitypes.LifecycleEvent{Type: apitypes.EventRunFinished, SandboxID: res.SandboxID,
		Tenant: tenantOf(ctx), Data: map[string]any{"run_id": res.RunID, "language": res.Language,
			"success": res.Success, "exit_code": res.ExitCode, "duration_ms": res.DurationMS,
			"termination": res.Termination}})
}

// announceQuota announces a create its caller's quota refused.
func (e *Engine) announceQuota(ctx context.Context, err error) {
	p, _ := principal.From(ctx)
	e.sandboxes.Announce(apitypes.LifecycleEvent{Type: apitypes.EventQuotaReached, Tenant: p.Tenant,
		Data: map[string]any{"key_id": p.KeyID, "reason": errdefs.MessageOf(err)}})
}

// announceDrain announces the start of the node's drain.
func (e *Engine) announceDrain(ctx context.Context) {
	data := map[string]any{"node": e.cfg.Node.Name}
	if st, err := e.NodeStatus(ctx); err == nil {
		data["live_sandboxes"] = st.Live
	}
	e.sandboxes.Announce(apitypes.LifecycleEvent{Type: apitypes.EventNodeDrained, Data: data})
}
