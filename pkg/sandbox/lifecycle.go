package sandbox

import (
	"maps"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Lifecycle events: the one seam the daemon's lifecycle webhooks
// (pkg/services/webhooks) take their events from. The manager announces
// its sandboxes' (created, ready, paused, resumed, terminated with the
// cause, failed) and an autofix loop's end; the engine announces through
// Announce what happens outside the manager (a run finished, a quota
// reached, the node's drain). Unclaimed warm sandboxes are nobody's: they
// announce nothing until a request claims one, which announces created
// and ready for its caller.

// lifecycleSink is the function events go to (nil: none).
type lifecycleSink = func(apitypes.LifecycleEvent)

// OnLifecycle makes fn receive every lifecycle event. fn runs on the
// announcing goroutine, at times under a sandbox's lock: it must not
// block.
func (m *Manager) OnLifecycle(fn func(apitypes.LifecycleEvent)) {
	m.lifecycle.Store(&fn)
}

// Announce passes ev to the lifecycle sink, if any.
func (m *Manager) Announce(ev apitypes.LifecycleEvent) {
	fn := m.lifecycle.Load()
	if fn == nil {
		return
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	(*fn)(ev)
}

// announceSandbox announces event typ of sb, whose lock the caller holds.
func (m *Manager) announceSandbox(sb *Sandbox, typ, cause string) {
	if m.lifecycle.Load() == nil || isWarm(sb.spec) {
		return
	}
	data := map[string]any{}
	if len(sb.spec.Labels) > 0 {
		data["sandbox_metadata"] = maps.Clone(sb.spec.Labels)
	}
	if typ == apitypes.EventSandboxTerminated || typ == apitypes.EventSandboxPaused {
		// E2B's execution block on killed and paused.
		data["execution"] = map[string]any{
			"started_at":     sb.createdAt.UTC().Format(time.RFC3339),
			"vcpu_count":     sb.spec.Limits.CPUs,
			"memory_mb":      sb.spec.Limits.MemoryBytes >> 20,
			"execution_time": time.Since(sb.createdAt).Milliseconds(),
		}
	}
	if sb.spec.Language != "" {
		data["language"] = sb.spec.Language
	}
	m.Announce(apitypes.LifecycleEvent{Type: typ, SandboxID: sb.ID, Tenant: sb.owner(), Template: sb.spec.Template,
		Image: sb.spec.Image, Cause: cause, Data: data})
}

// announceTransition announces what a transition of sb means, under sb's
// lock; ready <-> running (a command's start and end) means nothing.
func (m *Manager) announceTransition(sb *Sandbox, from, to State, reason string) {
	switch {
	case from == StateCreating && to == StateReady:
		m.announceSandbox(sb, apitypes.EventSandboxReady, "")
	case to == StatePaused:
		m.announceSandbox(sb, apitypes.EventSandboxPaused, "")
	case from == StatePaused && (to == StateReady || to == StateRunning):
		m.announceSandbox(sb, apitypes.EventSandboxResumed, "")
	case to == StateTerminated:
		m.announceSandbox(sb, apitypes.EventSandboxTerminated, reason)
	case to == StateFailed:
		m.announceSandbox(sb, apitypes.EventSandboxFailed, reason)
	}
}
