package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The test binary is also a container init (the container backend is
// set up beside the VM backend); libcontainer re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// TestManagerWithVMBackend runs a VM sandbox through the lifecycle
// (sandbox.Manager) next to the container backend: Spec.Backend picks
// the VM backend, commands run through the same agent protocol, gc sees
// both backends' resources, terminate releases the VM through the ledger.
func TestManagerWithVMBackend(t *testing.T) {
	testenv.RequireRoot(t)
	img := vmenv.Image(t)
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	images, err := image.OpenStore(testenv.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("/run", "vmmt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	parent := "/mcp-sandboxd-vmmt-" + testenv.RandHex(4)
	t.Cleanup(func() {
		testenv.RemoveCgroupParent(t, parent+"/vms")
		testenv.RemoveCgroupParent(t, parent)
	})
	l := ledger.New(db)
	rt, err := runtime.New(filepath.Join(runDir, "runtime"), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := container.New(container.Options{Runtime: rt, AgentPath: testenv.AgentPath(t), RunDir: runDir,
		CgroupParent: parent, Log: testenv.Logger(t)}, l)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := New(Options{AgentPath: testenv.AgentPath(t), RunDir: runDir, GuestCache: vmenv.GuestCache(),
		CgroupParent: parent, RunAs: "nobody", FastStart: true, Log: testenv.Logger(t)}, l)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.NewManager(sandbox.Options{Store: db, Images: images, Backend: cb, Backends: []sandbox.Backend{vb},
		Ledger: l, Log: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	spec := sandbox.Spec{Language: "python", Image: img.Name, Network: "none", UID: 1000,
		Limits: sandbox.Limits{MemoryBytes: 256 << 20, CPUs: 1, Pids: 256}}

	bad := spec
	bad.Backend = "bhyve"
	if _, err := m.Create(ctx, bad); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "backend") {
		t.Fatalf("unknown backend: %v", err)
	}

	spec.Backend = "vm"
	t0 := time.Now()
	info, err := m.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM sandbox %s ready in %v", info.ID, time.Since(t0))
	t.Cleanup(func() { _, _ = m.Terminate(context.Background(), info.ID, "test cleanup") })
	res, err := m.Exec(ctx, info.ID, sandbox.ExecSpec{Argv: []string{"python3", "-c", "import platform; print(6*7, platform.system())"}, Timeout: time.Minute}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "42 Linux\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	res, err = m.Exec(ctx, info.ID, sandbox.ExecSpec{Argv: []string{"sh", "-c", "sleep 30"}, Timeout: 500 * time.Millisecond}, nil)
	if err != nil || res.Termination.Cause != "timeout" {
		t.Fatalf("timeout in a VM: %+v %v", res, err)
	}

	rep := m.GC(ctx)
	for _, r := range rep.Removed {
		if strings.Contains(r, info.ID) {
			t.Fatalf("gc removed the live VM sandbox: %v", rep.Removed)
		}
	}
	held, _ := l.Resources(ctx, info.ID)
	var pid int
	if b, err := os.ReadFile(filepath.Join(runDir, "vms", info.ID, "vm.json")); err == nil {
		fmt.Sscanf(string(b[strings.Index(string(b), `"pid":`)+6:]), "%d", &pid)
	}
	if len(held) != 2 || pid == 0 {
		t.Fatalf("ledger %+v, pid %d", held, pid)
	}
	if _, err := m.Terminate(ctx, info.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if left, _ := l.Resources(ctx, info.ID); len(left) != 0 {
		t.Fatalf("ledger after terminate: %+v", left)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
		t.Fatalf("qemu pid %d still running", pid)
	}
	if _, err := os.Stat(filepath.Join(runDir, "vms", info.ID)); !os.IsNotExist(err) {
		t.Fatalf("vm dir left: %v", err)
	}
}
