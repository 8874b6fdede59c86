package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/runc/libcontainer"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// GCReport lists what reconciliation or garbage collection did.
type GCReport = apitypes.GCReport

func reportRemoved(r *GCReport, format string, args ...any) {
	r.Removed = append(r.Removed, fmt.Sprintf(format, args...))
}

func reportError(r *GCReport, format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}

// Reconcile compares SQLite, libcontainer's state and the kernel after a
// daemon start: a sandbox whose init is alive is adopted (agent reconnected,
// running commands re-attached), one whose init is gone is marked terminated
// and its leftovers removed, and then everything that belongs to no live
// sandbox is garbage-collected. Every action is logged with what it touched.
func (m *Manager) Reconcile(ctx context.Context) (*GCReport, error) {
	rep := &GCReport{}
	recs, err := m.opt.Store.ListSandboxes(ctx, store.ListFilter{
		States: []string{string(StateCreating), string(StateReady), string(StateRunning)},
	})
	if err != nil {
		return nil, fmt.Errorf("list recorded sandboxes: %w", err)
	}
	for _, rec := range recs {
		m.mu.Lock()
		_, known := m.sandboxes[rec.ID]
		m.mu.Unlock()
		if known {
			continue
		}
		m.reconcileOne(ctx, rec, rep)
	}
	m.collect(rep)
	return rep, nil
}

func (m *Manager) reconcileOne(ctx context.Context, rec *store.SandboxRecord, rep *GCReport) {
	var spec Spec
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		m.log.Error("reconcile: unreadable sandbox spec", "sandbox", rec.ID, "err", err)
	}
	sb := &Sandbox{
		ID: rec.ID, spec: spec, state: State(rec.State), createdAt: rec.CreatedAt, lastActive: rec.LastActiveAt,
		digest: rec.ImageDigest, cgroupPath: rec.CgroupPath,
		dir:    filepath.Join(m.opt.RunDir, "sandboxes", rec.ID),
		pooled: isWarm(spec),
	}
	if sb.cgroupPath == "" {
		sb.cgroupPath = filepath.Join(m.opt.CgroupParent, rec.ID)
	}
	dead := func(reason string) {
		m.log.Info("reconcile: sandbox is gone; cleaning up", "sandbox", sb.ID, "reason", reason)
		m.teardown(sb)
		to := StateTerminated
		if sb.state == StateCreating {
			to = StateFailed
		}
		if err := m.transition(ctx, sb, to, reason); err != nil {
			reportError(rep, "%s: %v", sb.ID, err)
			return
		}
		rep.Terminated = append(rep.Terminated, sb.ID)
	}
	if sb.state == StateCreating {
		dead("the daemon stopped while the sandbox was being created")
		return
	}
	inst, err := m.opt.Runtime.Adopt(rec.ID)
	switch {
	case errors.Is(err, libcontainer.ErrNotExist) || errors.Is(err, runtime.ErrNotRunning):
		dead("sandbox init exited while the daemon was down")
		return
	case err != nil:
		dead(fmt.Sprintf("cannot load the container: %v", err))
		return
	}
	if rec.InitPID != 0 && inst.Pid != rec.InitPID {
		dead(fmt.Sprintf("init pid %d does not match the recorded %d", inst.Pid, rec.InitPID))
		return
	}
	sb.inst = inst
	sb.agent = agent.NewClient(filepath.Join(sb.dir, "agent", agentSocketName))
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = sb.agent.Ping(pctx)
	var jobs []agent.JobInfo
	if err == nil {
		jobs, err = sb.agent.Jobs(pctx)
	}
	cancel()
	if err != nil {
		dead(fmt.Sprintf("agent unreachable after daemon restart: %v", err))
		return
	}
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	running := 0
	for _, j := range jobs {
		if j.Exit == nil {
			running++
			sb.mu.Lock()
			sb.running++
			sb.mu.Unlock()
			go m.watchJob(sb, j.ID, j.StdoutBytes, j.StderrBytes)
		}
	}
	switch {
	case running > 0 && sb.state == StateReady:
		err = m.transition(ctx, sb, StateRunning, "commands re-attached after daemon restart")
	case running == 0 && sb.state == StateRunning:
		err = m.transition(ctx, sb, StateReady, "commands finished while the daemon was down")
	}
	if err != nil {
		reportError(rep, "%s: %v", sb.ID, err)
	}
	go m.watchInit(sb)
	rep.Adopted = append(rep.Adopted, sb.ID)
	m.log.Info("reconcile: adopted sandbox", "sandbox", sb.ID, "state", sb.state, "running_commands", running)
}

// GC removes everything that belongs to no live sandbox: libcontainer state,
// cgroups, mounts and sandbox directories, as a crash may leave them.
func (m *Manager) GC(ctx context.Context) *GCReport {
	rep := &GCReport{}
	m.collect(rep)
	return rep
}

func (m *Manager) collect(rep *GCReport) {
	m.mu.Lock()
	live := make(map[string]bool, len(m.sandboxes))
	for id := range m.sandboxes {
		live[id] = true
	}
	m.mu.Unlock()
	orphan := func(name string) bool { return strings.HasPrefix(name, "sb-") && !live[name] }

	if ids, err := m.opt.Runtime.List(); err != nil {
		reportError(rep, "list runtime state: %v", err)
	} else {
		for _, id := range ids {
			if !orphan(id) {
				continue
			}
			if err := m.opt.Runtime.Destroy(id, 0); err != nil {
				reportError(rep, "destroy orphan container %s: %v", id, err)
				continue
			}
			reportRemoved(rep, "container %s (processes killed, libcontainer state removed)", id)
			m.log.Info("gc: removed orphan container", "sandbox", id)
		}
	}
	sbRoot := filepath.Join(m.opt.RunDir, "sandboxes")
	if ents, err := os.ReadDir(sbRoot); err != nil && !os.IsNotExist(err) {
		reportError(rep, "list sandbox dirs: %v", err)
	} else {
		for _, e := range ents {
			if !orphan(e.Name()) {
				continue
			}
			dir := filepath.Join(sbRoot, e.Name())
			if err := image.ReleaseDir(filepath.Join(dir, "layers")); err != nil {
				reportError(rep, "unmount %s: %v", dir, err)
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				reportError(rep, "remove %s: %v", dir, err)
				continue
			}
			reportRemoved(rep, "sandbox dir %s (mounts released)", dir)
			m.log.Info("gc: removed orphan sandbox dir", "dir", dir)
		}
	}
	if names, err := cgroups.Children(m.opt.CgroupParent); err != nil {
		reportError(rep, "list cgroups: %v", err)
	} else {
		for _, name := range names {
			if !orphan(name) {
				continue
			}
			p := filepath.Join(m.opt.CgroupParent, name)
			if err := cgroups.Remove(p); err != nil {
				reportError(rep, "remove cgroup %s: %v", p, err)
				continue
			}
			reportRemoved(rep, "cgroup %s", p)
			m.log.Info("gc: removed orphan cgroup", "cgroup", p)
		}
	}
}
