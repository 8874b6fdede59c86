package sandbox

import (
	"context"
	"encoding/json"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Ownership lives here, where a sandbox id is resolved (lookup, Get, List,
// terminate, Subscribe), not in each operation: everything that hangs off
// a sandbox (commands, jobs, files, terminals, snapshots, exposures, runs,
// autofix loops, agent sessions) reaches it through one of those, so a
// caller of another tenant meets the same not_found as for an id that
// never existed, with the same message.

// visible says whether ctx's caller may see a sandbox of tenant: callers
// without a principal (the engine's own work, tests) and admins see all.
func visible(ctx context.Context, tenant string) bool {
	p, ok := principal.From(ctx)
	return !ok || p.Admin || p.Tenant == tenant
}

// errNoSandbox is the answer for an id that does not exist or that the
// caller may not see: one message for both.
func errNoSandbox(id string) error {
	return errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
}

// recordTenant is the owner recorded in a sandbox's spec.
func recordTenant(rec *store.SandboxRecord) string {
	var s struct {
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(rec.Spec, &s) // written by us; unreadable: no owner, admins only see it
	return s.Tenant
}

func (sb *Sandbox) setTenant(t string) { sb.tenant.Store(&t) }

// owner is the sandbox's tenant.
func (sb *Sandbox) owner() string {
	if t := sb.tenant.Load(); t != nil {
		return *t
	}
	return ""
}

// Visible says whether ctx's caller may see sandbox id (live or not); the
// services that keep records of their own by sandbox id (runs, snapshots,
// agent sessions) filter their lists with it.
func (m *Manager) Visible(ctx context.Context, id string) bool {
	if p, ok := principal.From(ctx); !ok || p.Admin {
		return true
	}
	_, err := m.Get(ctx, id)
	return err == nil
}

// HeldBy is what the live sandboxes created with API key keyID hold, for
// its quota. Sandboxes still creating are not counted: their create holds
// an admission (Options.Admit) until it ends.
func (m *Manager) HeldBy(keyID string) apitypes.KeyUse {
	var u apitypes.KeyUse
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.sandboxes {
		sb.mu.Lock()
		if sb.spec.KeyID == keyID && !sb.terminating && sb.state != StateCreating {
			u.Sandboxes++
			u.MemoryMB += (sb.spec.Limits.MemoryBytes + 1<<20 - 1) >> 20
			u.CPUs += sb.spec.Limits.CPUs
			u.DiskMB += (sb.spec.Limits.DiskBytes + 1<<20 - 1) >> 20
		}
		sb.mu.Unlock()
	}
	return u
}

// ByTenant is what the live sandboxes hold, per tenant ("" for the
// socket's and the warm pool's), for per-tenant metrics.
func (m *Manager) ByTenant() map[string]apitypes.KeyUse {
	out := map[string]apitypes.KeyUse{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.sandboxes {
		sb.mu.Lock()
		if !sb.terminating {
			u := out[sb.spec.Tenant]
			u.Sandboxes++
			u.MemoryMB += (sb.spec.Limits.MemoryBytes + 1<<20 - 1) >> 20
			u.CPUs += sb.spec.Limits.CPUs
			u.DiskMB += (sb.spec.Limits.DiskBytes + 1<<20 - 1) >> 20
			out[sb.spec.Tenant] = u
		}
		sb.mu.Unlock()
	}
	return out
}
