package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
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
		States: []string{string(StateCreating), string(StateReady), string(StateRunning), string(StatePaused)},
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
	m.collect(ctx, rep)
	return rep, nil
}

// reconcileOne adopts one recorded sandbox the manager does not hold:
// alive with its agent answering, it is watched again; otherwise what it
// held is released and it is marked ended.
func (m *Manager) reconcileOne(ctx context.Context, rec *store.SandboxRecord, rep *GCReport) {
	var spec Spec
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		m.log.Error("reconcile: unreadable sandbox spec", "sandbox", rec.ID, "err", err)
	}
	sb := &Sandbox{
		ID: rec.ID, spec: spec, state: State(rec.State), createdAt: rec.CreatedAt, lastActive: rec.LastActiveAt,
		digest: rec.ImageDigest, pooled: isWarm(spec),
	}
	sb.setTenant(spec.Tenant) // its owner, from its record: ownership survives restarts
	dead := func(reason string) {
		m.log.Info("reconcile: sandbox is gone; releasing what it held", "sandbox", sb.ID, "reason", reason)
		m.release(ctx, sb.ID, rep)
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
	held, err := m.opt.Ledger.Resources(ctx, rec.ID)
	if err != nil {
		reportError(rep, "%s: read ledger: %v", rec.ID, err)
		return
	}
	b, err := m.backend(spec.Backend)
	if err != nil {
		dead(err.Error())
		return
	}
	h, err := b.Adopt(ctx, AdoptRequest{ID: rec.ID, Spec: spec, Resources: held,
		Identity: Identity{PID: rec.InitPID, StartTime: rec.InitStartTime}})
	if err != nil {
		dead(err.Error())
		return
	}
	sb.handle, sb.agent = h, agentClient(h)
	sb.setCaps(h)
	if al, ok := h.(Agentless); ok {
		m.adoptAgentless(ctx, sb, al, rep)
		return
	}
	jobs, reason := m.reachAdoptedAgent(ctx, sb, h)
	if reason != "" {
		dead(reason)
		return
	}
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	running := m.reattachJobs(ctx, sb, jobs, rep)
	m.watchInit(sb)
	rep.Adopted = append(rep.Adopted, sb.ID)
	m.log.Info("reconcile: adopted sandbox", "sandbox", sb.ID, "state", sb.state, "running_commands", running)
}

// reachAdoptedAgent pings an adopted sandbox's agent and lists its jobs.
// A frozen agent cannot answer: it is thawed for the ping and the list,
// and frozen again if it is recorded paused — the record wins over a
// pause or resume the daemon died in the middle of. A non-empty reason
// says why the sandbox is dead.
func (m *Manager) reachAdoptedAgent(ctx context.Context, sb *Sandbox, h Handle) ([]agent.JobInfo, string) {
	pauser, canPause := h.(Pauser)
	if canPause {
		if frozen, err := pauser.Paused(); err == nil && frozen {
			if err := pauser.Resume(ctx); err != nil {
				return nil, fmt.Sprintf("cannot thaw after daemon restart: %v", err)
			}
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := sb.agent.Ping(pctx)
	var jobs []agent.JobInfo
	if err == nil {
		jobs, err = sb.agent.Jobs(pctx)
	}
	cancel()
	if err != nil {
		return nil, fmt.Sprintf("agent unreachable after daemon restart: %v", err)
	}
	if sb.state == StatePaused {
		if !canPause {
			return nil, "recorded paused, but its backend cannot pause"
		}
		if err := pauser.Pause(ctx); err != nil {
			return nil, fmt.Sprintf("cannot freeze again after daemon restart: %v", err)
		}
	}
	return jobs, ""
}

// reattachJobs watches the adopted sandbox's running jobs again and
// moves it between ready and running by what ran on while the daemon was
// down. It returns how many jobs still run.
func (m *Manager) reattachJobs(ctx context.Context, sb *Sandbox, jobs []agent.JobInfo, rep *GCReport) int {
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
	var err error
	switch {
	case running > 0 && sb.state == StateReady:
		err = m.transition(ctx, sb, StateRunning, "commands re-attached after daemon restart")
	case running == 0 && sb.state == StateRunning:
		err = m.transition(ctx, sb, StateReady, "commands finished while the daemon was down")
	}
	if err != nil {
		reportError(rep, "%s: %v", sb.ID, err)
	}
	return running
}

// adoptAgentless adopts a sandbox without an agent (see Agentless): its
// backend found its process and identity in Adopt; its guest agent is
// reconnected here. A guest agent that does not answer yet does not make it
// dead (its process is alive and it may hold a user's work: a Windows guest
// busy installing updates answers minutes later); the failure is logged,
// and calls reaching the guest report it until it answers. Without an
// agent no command of the daemon's survives a restart, so a sandbox
// recorded running is ready again.
func (m *Manager) adoptAgentless(ctx context.Context, sb *Sandbox, al Agentless, rep *GCReport) {
	wctx, cancel := context.WithTimeout(ctx, adoptReadyWait)
	if err := al.WaitReady(wctx); err != nil {
		m.log.Warn("reconcile: adopted sandbox's guest agent does not answer yet", "sandbox", sb.ID, "err", err)
	}
	cancel()
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	if sb.state == StateRunning {
		if err := m.transition(ctx, sb, StateReady, "commands finished while the daemon was down"); err != nil {
			reportError(rep, "%s: %v", sb.ID, err)
		}
	}
	m.watchInit(sb)
	rep.Adopted = append(rep.Adopted, sb.ID)
	m.log.Info("reconcile: adopted sandbox without an agent", "sandbox", sb.ID, "state", sb.state)
}

// adoptReadyWait bounds the wait for an adopted agentless sandbox's guest
// agent.
const adoptReadyWait = 10 * time.Second

// release releases what sandbox id holds — its ledger, plus anything of it
// the backend's scan found — and reports each resource.
func (m *Manager) release(ctx context.Context, id string, rep *GCReport, found ...ledger.Resource) {
	done, err := m.opt.Ledger.Release(context.WithoutCancel(ctx), id, found...)
	for _, r := range done {
		if r.Err == nil {
			reportRemoved(rep, "%s: %s", id, r.Resource)
		}
	}
	if err != nil {
		reportError(rep, "%v", err)
		m.log.Error("release sandbox resources", "sandbox", id, "err", err)
	}
}

// GC releases everything that belongs to no live sandbox: what the ledger
// still names for dead ones (a release that failed, a crash mid-create) and
// what the backend finds on the host that no ledger names, as a crash before
// the ledger existed may leave.
func (m *Manager) GC(ctx context.Context) *GCReport {
	rep := &GCReport{}
	m.collect(ctx, rep)
	return rep
}

func (m *Manager) collect(ctx context.Context, rep *GCReport) {
	m.mu.Lock()
	live := make(map[string]bool, len(m.sandboxes))
	for id := range m.sandboxes {
		live[id] = true
	}
	m.mu.Unlock()
	found := map[string][]ledger.Resource{}
	for _, b := range m.allBackends() {
		f, err := b.Scan(ctx)
		if err != nil {
			reportError(rep, "scan %s backend: %v", b.Name(), err)
		}
		for id, rs := range f {
			found[id] = append(found[id], rs...)
		}
	}
	owners, err := m.opt.Ledger.Owners(ctx)
	if err != nil {
		reportError(rep, "list ledger: %v", err)
	}
	ids := map[string]bool{}
	for id := range found {
		ids[id] = true
	}
	for _, id := range owners {
		// A service's own owners (named volumes) are no sandbox's: never
		// garbage.
		if !m.opt.Ledger.Claimed(id) {
			ids[id] = true
		}
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		if !live[id] {
			sorted = append(sorted, id)
		}
	}
	sort.Strings(sorted)
	for _, id := range sorted {
		m.log.Info("gc: releasing what a dead sandbox left", "sandbox", id)
		m.release(ctx, id, rep, found[id]...)
	}
}
