package sandbox

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Handle returns the backend's handle of live sandbox id and the name of
// its backend, for operations only one backend has (a VM's snapshots and
// screenshots). The handle is the backend's own: callers type-assert it.
func (m *Manager) Handle(ctx context.Context, id string) (Handle, string, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, "", err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.handle == nil || sb.terminating {
		return nil, "", errdefs.Conflictf("sandbox %s is %s", id, sb.state)
	}
	name := sb.spec.Backend
	if name == "" {
		name = m.opt.Backend.Name()
	}
	return sb.handle, name, nil
}
