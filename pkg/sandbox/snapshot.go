package sandbox

import (
	"context"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// WritableDirs are the host paths of a sandbox's writable state, for
// workspace snapshots (pkg/engine/snapshot.go, pkg/storage/snapshot.go).
type WritableDirs struct {
	// Upper is the rootfs overlay's upper layer. It is part of a mounted
	// overlay: read it, never write it (overlayfs leaves changes to a
	// mounted layer undefined).
	Upper string
	// Rootfs is the mounted overlay on the host (the merged view); changes
	// to the root file system are made through it.
	Rootfs    string
	Workspace string
	Tmp       string
	// DaemonFiles are paths of the root file system (relative; with all
	// below them) that the daemon writes or mounts on for each sandbox
	// (its /etc/hosts, hostname, resolv.conf, the agent's mount points):
	// they belong to the sandbox, not to a snapshot.
	DaemonFiles []string
	// UID is the sandbox's user.
	UID int
}

// WritableState is a Handle whose writable state the daemon reaches on the
// host (the container backend; a VM's disk is not).
type WritableState interface {
	WritableDirs() WritableDirs
}

// Frozen runs fn with every process of sandbox id frozen (the Pauser of
// its backend; a sandbox paused by request stays paused), so that fn sees
// its files at rest. The sandbox's lock is held throughout: no command
// starts, and no transition happens, while fn runs. fn runs only for a
// ready, running or paused sandbox.
func (m *Manager) Frozen(ctx context.Context, id string, fn func(WritableDirs) error) error {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return m.frozenLocked(ctx, sb, fn)
}

func (m *Manager) frozenLocked(ctx context.Context, sb *Sandbox, fn func(WritableDirs) error) error {
	if sb.terminating || !(sb.state == StateReady || sb.state == StateRunning || sb.state == StatePaused) {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	ws, ok := sb.handle.(WritableState)
	p, canPause := sb.handle.(Pauser)
	if !ok || !canPause {
		return errdefs.Unavailablef("the %s backend cannot snapshot sandboxes", m.opt.Backend.Name())
	}
	if sb.state != StatePaused {
		if err := p.Pause(ctx); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "freeze sandbox %s", sb.ID)
		}
		defer func() {
			if err := p.Resume(context.WithoutCancel(ctx)); err != nil {
				m.log.Error("thaw sandbox after a snapshot", "sandbox", sb.ID, "err", err)
			}
		}()
	}
	return fn(ws.WritableDirs())
}

// jobsStopWait bounds how long Replace waits for killed jobs to end.
const jobsStopWait = 10 * time.Second

// Replace stops every job of sandbox id (SIGKILL through its agent, then
// waits until the agent reports none running), and runs fn with the
// sandbox frozen, like Frozen, to replace its writable state. A paused
// sandbox is refused (its agent cannot stop jobs while frozen): resume it
// first. The sandbox keeps its id, limits and network.
func (m *Manager) Replace(ctx context.Context, id string, fn func(WritableDirs) error) error {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state == StatePaused {
		return errdefs.Conflictf("sandbox_id: sandbox %s is paused; resume it before a restore", sb.ID)
	}
	if sb.terminating || !(sb.state == StateReady || sb.state == StateRunning) {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	// The lock keeps new commands from starting (beginCommand takes it);
	// the ones in flight are killed here and their callers see them end.
	if err := m.stopJobsLocked(ctx, sb); err != nil {
		return err
	}
	return m.frozenLocked(ctx, sb, fn)
}

// stopJobsLocked kills every running job of sb and waits for them to end.
func (m *Manager) stopJobsLocked(ctx context.Context, sb *Sandbox) error {
	deadline := time.Now().Add(jobsStopWait)
	for {
		jobs, err := sb.agent.Jobs(ctx)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list jobs of %s", sb.ID)
		}
		running := 0
		for _, j := range jobs {
			if j.Exit != nil {
				continue
			}
			running++
			if err := sb.agent.Signal(ctx, j.ID, "SIGKILL"); err != nil {
				m.log.Debug("kill job for a restore", "sandbox", sb.ID, "job", j.ID, "err", err)
			}
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("sandbox %s: %d jobs still running %s after SIGKILL", sb.ID, running, jobsStopWait)
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "stop jobs of %s", sb.ID)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SpecOf returns the spec of live sandbox id.
func (m *Manager) SpecOf(ctx context.Context, id string) (Spec, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return Spec{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.spec, nil
}
