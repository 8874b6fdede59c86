package sandbox

import "github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"

// PublishAutofix publishes an autofix loop's event (an attempt, a fix, the
// result) as a "fix_attempt" event of the loop's sandbox, to the event
// subscribers (/v1/events).
func (m *Manager) PublishAutofix(sandboxID string, ev apitypes.AutofixEvent) {
	if ev.Type == "result" && ev.Result != nil && ev.Result.Status != "running" && ev.Result.Status != "needs_fix" {
		m.announceAutofix(sandboxID, ev.Result)
	}
	if m.events.active() {
		tenant := ""
		m.mu.Lock()
		if sb := m.sandboxes[sandboxID]; sb != nil {
			tenant = sb.owner()
		}
		m.mu.Unlock()
		m.events.publish(Event{Type: "fix_attempt", SandboxID: sandboxID, Tenant: tenant, Autofix: &ev})
	}
}

// announceAutofix announces the end of an autofix loop.
func (m *Manager) announceAutofix(sandboxID string, r *apitypes.AutofixResult) {
	tenant := ""
	m.mu.Lock()
	if sb := m.sandboxes[sandboxID]; sb != nil {
		tenant = sb.owner()
	}
	m.mu.Unlock()
	m.Announce(apitypes.LifecycleEvent{Type: apitypes.EventAutofixFinished, SandboxID: sandboxID, Tenant: tenant,
		Data: map[string]any{"autofix_id": r.AutofixID, "run_id": r.RunID, "language": r.Language, "status": r.Status,
			"success": r.Success, "attempts": r.Attempts, "stop_reason": r.StopReason}})
}
