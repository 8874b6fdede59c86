package engine

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
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
		Defaults: apitypes.Limits{MemoryBytes: int64(e.cfg.Sandbox.Memory), CPUs: e.cfg.Sandbox.CPUs, DiskBytes: int64(e.cfg.Sandbox.Disk)},
		E2BPort:  int(e.e2bPort.Load()), PreviewPort: int(e.previewPort.Load()),
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
// creates, and gateways place none here. The flag persists in the state
// directory (drainFile) before the answer: a drain ahead of maintenance
// holds through the daemon's restarts until it is ended.
func (e *Engine) SetDraining(ctx context.Context, draining bool) (*apitypes.NodeStatus, error) {
	if err := writeDrain(e.cfg.Paths.StateDir, draining); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "draining: persist the flag")
	}
	was := e.draining.Swap(draining)
	e.log.Info("node drain", "draining", draining)
	if draining && !was {
		e.announceDrain(ctx)
	}
	return e.NodeStatus(ctx)
}

// SetListenerPorts tells NodeStatus the ports of the E2B and preview
// listeners (0: off), which the daemon opens after the engine.
func (e *Engine) SetListenerPorts(e2b, preview int) {
	e.e2bPort.Store(int64(e2b))
	e.previewPort.Store(int64(preview))
}

// drainFile, in paths.state_dir, holds the drain flag: present means
// draining. A file rather than a row: it is one bit, read once at start.
const drainFile = "node-draining"

// writeDrain persists the flag: the file is created (and synced with its
// directory) or removed. A file already there is left as it is: its time is
// when the drain began (sandboxd_node_draining_since_timestamp_seconds).
func writeDrain(dir string, draining bool) error {
	path := filepath.Join(dir, drainFile)
	if !draining {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
	} else {
		// Presence is the flag: a file already there (the drain began
		// earlier, perhaps before a crash) is synced with its directory
		// below like a new one.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		switch {
		case os.IsExist(err):
		case err != nil:
			return err
		default:
			if _, err := f.WriteString("draining\n"); err != nil {
				f.Close()
				return err
			}
			if err := f.Sync(); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readDrain is the persisted flag (false when the state directory holds
// none).
func readDrain(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, drainFile))
	return err == nil
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
