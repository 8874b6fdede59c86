package sandbox

import "github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"

// PublishAutofix publishes an autofix loop's event (an attempt, a fix, the
// result) as a "fix_attempt" event of the loop's sandbox, to the event
// subscribers (/v1/events).
func (m *Manager) PublishAutofix(sandboxID string, ev apitypes.AutofixEvent) {
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
