package sandbox

import (
	"context"
	"slices"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// WritableDirs are the host paths of a sandbox's writable state, for
// workspace snapshots (pkg/services/snapshots, pkg/storage/snapshot.go).
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
	// IDBase is the host id of the sandbox's id 0 and IDSize the number
	// of ids its user namespace maps (0: no user namespace, host ids).
	IDBase, IDSize int
	// UID is the sandbox's user.
	UID int
}

// WritableState is a Handle whose writable state the daemon reaches on the
// host (the container backend; a VM's disk is not).
type WritableState interface {
	WritableDirs() WritableDirs
}

// What a sandbox is busy with while Frozen or Replace run (Sandbox.busy).
const (
	busySnapshot = "snapshot"
	busyRestore  = "restore"
)

// Frozen runs fn with every process of sandbox id frozen (the Pauser of
// its backend; a sandbox paused by request stays paused), so that fn sees
// its files at rest. fn runs only for a ready, running or paused sandbox.
// The sandbox's lock is not held while fn runs (it may take seconds, and
// the reaper and the pool take every sandbox's lock in turn): the sandbox
// is marked busy instead, which refuses pause, resume and a second
// snapshot or restore; a command started meanwhile waits for the thaw.
func (m *Manager) Frozen(ctx context.Context, id string, fn func(WritableDirs) error) error {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	err = m.markBusyLocked(sb, busySnapshot, StateReady, StateRunning, StatePaused)
	sb.mu.Unlock()
	if err != nil {
		return err
	}
	defer m.clearBusy(sb)
	return m.frozen(ctx, sb, fn)
}

// markBusyLocked checks that sb is in one of states and idle, and marks it
// busy with what.
func (m *Manager) markBusyLocked(sb *Sandbox, what string, states ...State) error {
	if sb.terminating || !slices.Contains(states, sb.state) {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	if sb.busy != "" {
		return errdefs.Conflictf("sandbox_id: sandbox %s is busy with a %s", sb.ID, sb.busy)
	}
	if sb.handle == nil {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	// FileSnapshot promises a WritableState that is also a Pauser.
	if caps := sb.handle.Capabilities(); !caps.Has(CapFileSnapshot) {
		return sb.missing(CapFileSnapshot, caps)
	}
	sb.busy = what
	return nil
}

func (m *Manager) clearBusy(sb *Sandbox) {
	sb.mu.Lock()
	sb.busy = ""
	sb.mu.Unlock()
}

// frozen freezes sb unless it is paused, runs fn, and thaws it again.
func (m *Manager) frozen(ctx context.Context, sb *Sandbox, fn func(WritableDirs) error) error {
	sb.mu.Lock()
	h, paused := sb.handle, sb.state == StatePaused
	sb.mu.Unlock()
	p := h.(Pauser)
	if !paused {
		if err := p.Pause(ctx); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "freeze sandbox %s", sb.ID)
		}
		defer func() {
			if err := p.Resume(context.WithoutCancel(ctx)); err != nil {
				m.log.Error("thaw sandbox after a snapshot or restore", "sandbox", sb.ID, "err", err)
			}
		}()
	}
	return fn(h.(WritableState).WritableDirs())
}

// jobsStopWait bounds how long Replace waits for killed jobs to end.
const jobsStopWait = 10 * time.Second

// Replace stops every command of sandbox id (SIGKILL to each job through
// its agent, until no command is in flight) and runs fn with the sandbox
// frozen, like Frozen, to replace its writable state. New commands, file
// operations, pause and resume are refused (conflict) until it returns. A
// paused sandbox is refused (its agent cannot stop jobs while frozen):
// resume it first. The sandbox keeps its id, limits and network.
func (m *Manager) Replace(ctx context.Context, id string, fn func(WritableDirs) error) error {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	if sb.state == StatePaused && !sb.terminating {
		sb.mu.Unlock()
		return errdefs.Conflictf("sandbox_id: sandbox %s is paused; resume it before a restore", sb.ID)
	}
	err = m.markBusyLocked(sb, busyRestore, StateReady, StateRunning)
	sb.mu.Unlock()
	if err != nil {
		return err
	}
	defer m.clearBusy(sb)
	if err := m.stopCommands(ctx, sb); err != nil {
		return err
	}
	return m.frozen(ctx, sb, fn)
}

// stopCommands kills every running job of sb until no command is in flight
// (sb.running: foreground commands, background jobs until their watcher
// saw them end), so that one that started just before sb was marked busy
// is caught as well.
func (m *Manager) stopCommands(ctx context.Context, sb *Sandbox) error {
	deadline := time.Now().Add(jobsStopWait)
	for {
		sb.mu.Lock()
		inFlight, client := sb.running, sb.agent
		sb.mu.Unlock()
		jobs, err := client.Jobs(ctx)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list jobs of %s", sb.ID)
		}
		running := 0
		for _, j := range jobs {
			if j.Exit != nil {
				continue
			}
			running++
			if err := client.Signal(ctx, j.ID, "SIGKILL"); err != nil {
				m.log.Debug("kill job for a restore", "sandbox", sb.ID, "job", j.ID, "err", err)
			}
		}
		if running == 0 && inFlight == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("sandbox %s: %d jobs still running %s after SIGKILL", sb.ID, max(running, inFlight), jobsStopWait)
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "stop jobs of %s", sb.ID)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
