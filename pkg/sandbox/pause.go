package sandbox

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Pause freezes every process of sandbox id (ready or running → paused). A
// paused sandbox keeps its memory, files and commands in flight but gets no
// CPU; it does not count towards the idle timeout (its lifetime still
// runs), and commands, files and terminals are refused with conflict until
// Resume. Pausing a paused sandbox returns it as it is.
func (m *Manager) Pause(ctx context.Context, id string) (*Info, error) {
	return m.pause(ctx, id, "paused by request")
}

// pause is Pause recording reason.
func (m *Manager) pause(ctx context.Context, id, reason string) (*Info, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := m.pauseSandbox(ctx, sb, reason); err != nil {
		return nil, err
	}
	// Described once sb.mu is released: Get takes the manager's lock,
	// which is taken before a sandbox's (the reaper), never after.
	return m.Get(ctx, id)
}

// pauseSandbox freezes sb under its lock (nothing to do when paused).
func (m *Manager) pauseSandbox(ctx context.Context, sb *Sandbox, reason string) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state == StatePaused && !sb.terminating {
		return nil
	}
	if sb.terminating || !(sb.state == StateReady || sb.state == StateRunning) {
		return errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	if sb.busy != "" {
		return errdefs.Conflictf("sandbox %s is busy with a %s", sb.ID, sb.busy)
	}
	p, err := sb.pauserLocked()
	if err != nil {
		return err
	}
	if err := p.Pause(ctx); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "pause sandbox %s", sb.ID)
	}
	if err := m.transitionLocked(ctx, sb, StatePaused, reason); err != nil {
		// Not recorded as paused: do not leave it frozen.
		if rerr := p.Resume(context.WithoutCancel(ctx)); rerr != nil {
			m.log.Error("thaw sandbox after a failed pause", "sandbox", sb.ID, "err", rerr)
		}
		return err
	}
	return nil
}

// Resume thaws a paused sandbox: back to running if commands were in
// flight, else ready, with its idle time counted from now. Resuming a
// sandbox that is not paused returns it as it is.
func (m *Manager) Resume(ctx context.Context, id string) (*Info, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := m.resumeSandbox(ctx, sb); err != nil {
		return nil, err
	}
	// Described once sb.mu is released (see pause): holding it here
	// deadlocked against the reaper, which holds the manager's lock and
	// waits for sb's (seen on cgroup v2 in TestCgroupLimitFiles).
	return m.Get(ctx, id)
}

// resumeSandbox thaws sb under its lock (nothing to do when it is ready
// or running).
func (m *Manager) resumeSandbox(ctx context.Context, sb *Sandbox) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.terminating {
		return errdefs.Conflictf("sandbox %s is terminating", sb.ID)
	}
	if sb.busy != "" {
		return errdefs.Conflictf("sandbox %s is busy with a %s", sb.ID, sb.busy)
	}
	if sb.state != StatePaused {
		if sb.state == StateReady || sb.state == StateRunning {
			return nil
		}
		return errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.state)
	}
	p, err := sb.pauserLocked()
	if err != nil {
		return err
	}
	if err := p.Resume(ctx); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "resume sandbox %s", sb.ID)
	}
	to := StateReady
	if sb.running > 0 {
		to = StateRunning
	}
	now := m.opt.Now()
	sb.lastActive = now
	return m.transitionLocked(ctx, sb, to, "resumed by request", func(r *store.SandboxRecord) {
		r.LastActiveAt = now.UTC()
	})
}

// pauserLocked is sb's handle as a Pauser clients may use (CapPause).
func (sb *Sandbox) pauserLocked() (Pauser, error) {
	if sb.handle == nil {
		return nil, errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	caps := sb.handle.Capabilities()
	p, ok := sb.handle.(Pauser)
	if !ok || !caps.Has(CapPause) {
		return nil, sb.missing(CapPause, caps)
	}
	return p, nil
}
