package engine

import (
	"bufio"
	"context"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
)

// NodeStatus reports this daemon as a node of a fleet: what gateways place
// creates by (pkg/gateway). It counts every tenant's sandboxes: the
// route is admin only.
func (e *Engine) NodeStatus(ctx context.Context) (*apitypes.NodeStatus, error) {
	// Gateways ask every probe interval: the cheap part of readiness
	// (the store answers, seccomp holds, an image exists); the full
	// /readyz, with its write to the store, is the orchestrator's.
	st := &apitypes.NodeStatus{
		Name: e.cfg.Node.Name, Draining: e.draining.Load(),
		MaxSandboxes: e.cfg.Sandbox.MaxSandboxes, MemoryBytes: memTotal(), CPUs: float64(goruntime.NumCPU()),
		VM: e.vm.backend != nil, Images: []string{},
	}
	// From memory, not the store: gateways ask often, and the live
	// sandboxes (warm ones and those still starting included) are all in
	// the manager's map.
	for _, u := range e.sandboxes.ByTenant() {
		st.Live += u.Sandboxes
		st.MemoryCommittedBytes += u.MemoryMB << 20
		st.CPUsCommitted += u.CPUs
	}
	imgs, err := e.images.List()
	if err != nil {
		return nil, err
	}
	for _, im := range imgs {
		st.Images = append(st.Images, im.Name)
	}
	seccompOK := e.seccomp.OK() || e.cfg.Sandbox.SeccompProfile == seccomp.Unconfined
	st.Ready = len(imgs) > 0 && seccompOK && e.store.Ping(ctx) == nil
	return st, nil
}

// SetDraining starts or ends a drain: while draining the node refuses
// creates, and gateways place none here. The flag lives in memory: a
// restarted daemon takes creates again (a drain ahead of maintenance is
// repeated after it, by the operator or the orchestrator).
func (e *Engine) SetDraining(ctx context.Context, draining bool) (*apitypes.NodeStatus, error) {
	e.draining.Store(draining)
	e.log.Info("node drain", "draining", draining)
	return e.NodeStatus(ctx)
}

// memTotal is the machine's memory (MemTotal of /proc/meminfo), 0 if
// unreadable.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
