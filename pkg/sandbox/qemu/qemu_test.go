package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// waitAgent waits for the agent of a started VM as the manager does: within
// the boot budget derived for this host now, each ping allowed longer than
// the last (a busy host answers late, not never).
func waitAgent(t *testing.T, h sandbox.Handle) time.Duration {
	t.Helper()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), vm.BootBudget(VM(h).Accel()))
	defer cancel()
	c := agent.NewClient(h.Dial)
	attempt := time.Second
	for {
		pctx, pcancel := context.WithTimeout(ctx, attempt)
		_, err := c.Ping(pctx)
		pcancel()
		if err == nil {
			return time.Since(t0)
		}
		attempt = min(2*attempt, 16*time.Second)
		select {
		case <-ctx.Done():
			t.Fatalf("agent not ready: %v", err)
		case <-h.Done():
			t.Fatalf("qemu exited: %s", h.ExitDescription())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func run(t *testing.T, h sandbox.Handle, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := agent.NewClient(h.Dial)
	job, err := c.Start(ctx, agent.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := c.Attach(ctx, job, 0, 0, func(ch agent.Chunk) error { out.Write(ch.Data); return nil })
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("%v: %+v %v: %s", argv, st, err, out.String())
	}
	return out.String()
}

// TestBackend drives the VM backend through the sandbox seam: start (the
// first sandbox boots a fast-start template), the agent over virtio-serial,
// adopt after a "restart", scan, release through the ledger.
func TestBackend(t *testing.T) {
	testenv.RequireRoot(t)
	img := vmenv.Image(t)
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the releases registered later
	l := ledger.New(db)
	runDir, err := os.MkdirTemp("/run", "vmqt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	parent := "/mcp-sandboxd-vmqt-" + testenv.RandHex(4)
	t.Cleanup(func() {
		testenv.RemoveCgroupParent(t, parent+"/vms")
		testenv.RemoveCgroupParent(t, parent)
	})
	b, err := New(Options{
		AgentPath: testenv.AgentPath(t), RunDir: runDir, GuestCache: vmenv.GuestCache(),
		CgroupParent: parent, RunAs: "nobody", FastStart: true, Log: testenv.Logger(t),
	}, l)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "vm" {
		t.Fatalf("name %q", b.Name())
	}
	spec := sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 256 << 20, CPUs: 1}, UID: 1000}

	start := func(id string) (sandbox.Handle, time.Duration) {
		t.Helper()
		t.Cleanup(func() {
			if out, err := l.Release(context.Background(), id); err != nil {
				t.Errorf("release %s: %+v %v", id, out, err)
			}
		})
		t0 := time.Now()
		h, err := b.Start(ctx, sandbox.StartRequest{ID: id, Spec: spec, Image: img}, l.For(id))
		if err != nil {
			t.Fatal(err)
		}
		waitAgent(t, h)
		return h, time.Since(t0)
	}
	h, d := start("sb-vm1")
	t.Logf("first VM sandbox (boots and saves the template unless cached, then starts from it): %v", d)
	if got := run(t, h, "python3", "-c", "import os; print(6*7, os.getuid())"); got != "42 1000\n" {
		t.Fatalf("python in the guest: %q", got)
	}
	h2, d2 := start("sb-vm2")
	t.Logf("second VM sandbox (from the template): %v", d2)
	if got := run(t, h2, "cat", "/proc/sys/kernel/hostname"); got != "sandbox\n" {
		t.Fatalf("hostname %q", got)
	}
	if u, err := h2.Usage(ctx); err != nil || u.MemoryBytes < 16<<20 || u.Pids == 0 || u.CPUSeconds == 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
	if _, err := b.Start(ctx, sandbox.StartRequest{ID: "sb-net", Spec: spec, Image: img, NetNSPath: "/proc/self/ns/net"}, l.For("sb-net")); !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "network") {
		t.Fatalf("VM with network: %v", err)
	}

	// A restarted daemon: the old connections are gone, the ledger and the
	// identity recorded at ready remain.
	id := h.Identity()
	VM(h).Close()
	res, err := l.Resources(ctx, "sb-vm1")
	if err != nil || len(res) != 2 {
		t.Fatalf("ledger of sb-vm1: %+v %v", res, err)
	}
	a, err := b.Adopt(ctx, sandbox.AdoptRequest{ID: "sb-vm1", Spec: spec, Resources: res, Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, a, "echo", "adopted"); got != "adopted\n" {
		t.Fatalf("adopted: %q", got)
	}
	VM(a).Close()
	if _, err := b.Adopt(ctx, sandbox.AdoptRequest{ID: "sb-vm1", Spec: spec, Resources: res, Identity: sandbox.Identity{PID: id.PID + 1, StartTime: id.StartTime}}); err == nil {
		t.Fatal("adopt with a wrong identity succeeded")
	}

	scan, err := b.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"sb-vm1", "sb-vm2"} {
		if len(scan[sb]) != 2 {
			t.Fatalf("scan %s: %+v (all: %+v)", sb, scan[sb], scan)
		}
	}
	for _, sb := range []string{"sb-vm1", "sb-vm2"} {
		pid := 0
		if sb == "sb-vm1" {
			pid = id.PID
		} else {
			pid = h2.Identity().PID
		}
		if _, err := l.Release(ctx, sb); err != nil {
			t.Fatalf("release %s: %v", sb, err)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
			t.Errorf("%s: qemu pid %d still running", sb, pid)
		}
		if _, err := os.Stat(b.dir(sb)); !os.IsNotExist(err) {
			t.Errorf("%s: state dir left: %v", sb, err)
		}
		if cgroups.Exists(b.cgroupPath(sb)) {
			t.Errorf("%s: cgroup left", sb)
		}
	}
	if scan, _ := b.Scan(ctx); len(scan) != 0 {
		t.Fatalf("scan after release: %+v", scan)
	}
	if _, err := vm.Adopt(ctx, b.dir("sb-vm1")); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("adopt released: %v", err)
	}
}

func TestConsoleText(t *testing.T) {
	raw := "\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: failed to load Boot0001\r\nBdsDxe: No bootable option or device was found.\r\n\x07"
	if got := consoleText(raw, 1000); got != "BdsDxe: failed to load Boot0001 | BdsDxe: No bootable option or device was found." {
		t.Errorf("consoleText = %q", got)
	}
	if got := consoleText("", 10); got != "(empty)" {
		t.Errorf("empty console = %q", got)
	}
	if got := consoleText("0123456789abcdef", 4); got != "…cdef" {
		t.Errorf("cut console = %q", got)
	}
}
