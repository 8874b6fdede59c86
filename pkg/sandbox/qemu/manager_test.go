package qemu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The test binary is also a container init (the container backend is
// set up beside the VM backend); libcontainer re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	if os.Getenv("VMTEST_DAEMON_STATE") != "" {
		runChildDaemon()
	}
	os.Exit(m.Run())
}

// TestManagerWithVMBackend runs a VM sandbox through the lifecycle
// (sandbox.Manager) next to the container backend: Spec.Backend picks
// the VM backend, commands run through the same agent protocol, gc sees
// both backends' resources, terminate releases the VM through the ledger.
// managerEnv is a sandbox.Manager on private state (SQLite in dir, run dir
// and cgroup parent of its own) with the container backend as default and
// the VM backend beside it.
type managerEnv struct {
	m      *sandbox.Manager
	l      *ledger.Ledger
	db     *store.Store
	runDir string
}

func newManager(t testing.TB, stateDir, runDir, parent string) *managerEnv {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(stateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	images, err := image.OpenStore(testenv.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(db)
	rt, err := runtime.New(filepath.Join(runDir, "runtime"), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	disks, err := storage.NewStore(filepath.Join(stateDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disks.Close)
	cb, err := container.New(container.Options{Runtime: rt, AgentPath: testenv.AgentPath(t), RunDir: runDir,
		Storage: disks, CgroupParent: parent, Log: testenv.Logger(t)}, l)
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
	t.Cleanup(m.Close)
	return &managerEnv{m: m, l: l, db: db, runDir: runDir}
}

// privateDirs returns a state dir, a run dir under /run and a cgroup
// parent, removed when the test ends.
func privateDirs(t *testing.T) (stateDir, runDir, parent string) {
	t.Helper()
	runDir, err := os.MkdirTemp("/run", "vmmt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	parent = "/mcp-sandboxd-vmmt-" + testenv.RandHex(4)
	t.Cleanup(func() {
		testenv.RemoveCgroupParent(t, parent+"/vms")
		testenv.RemoveCgroupParent(t, parent)
	})
	return t.TempDir(), runDir, parent
}

func vmSpec(img string) sandbox.Spec {
	return sandbox.Spec{Language: "python", Image: img, Network: "none", UID: 1000, Backend: "vm",
		Limits: sandbox.Limits{MemoryBytes: 256 << 20, CPUs: 1, Pids: 256}}
}

func TestManagerWithVMBackend(t *testing.T) {
	testenv.RequireRoot(t)
	img := vmenv.Image(t)
	ctx := context.Background()
	stateDir, runDir, parent := privateDirs(t)
	env := newManager(t, stateDir, runDir, parent)
	m, l := env.m, env.l
	spec := vmSpec(img.Name)

	bad := spec
	bad.Backend = "bhyve"
	if _, err := m.Create(ctx, bad); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "backend") {
		t.Fatalf("unknown backend: %v", err)
	}

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

// TestDaemonKilledVMAdopted: a process running the Manager (the daemon)
// creates a VM sandbox and is killed with SIGKILL; a new Manager on the same
// state adopts the VM on reconciliation and runs commands in it.
func TestDaemonKilledVMAdopted(t *testing.T) {
	if os.Getenv("VMTEST_DAEMON_STATE") != "" {
		return // the child's work is done in TestMain (see runChildDaemon)
	}
	testenv.RequireRoot(t)
	img := vmenv.Image(t)
	stateDir, runDir, parent := privateDirs(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "VMTEST_DAEMON_STATE="+stateDir, "VMTEST_DAEMON_RUN="+runDir,
		"VMTEST_DAEMON_CGROUP="+parent, "VMTEST_DAEMON_IMAGE="+img.Name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "sandbox ") {
		t.Fatalf("child daemon: %q %v", line, err)
	}
	id := strings.TrimSpace(strings.TrimPrefix(line, "sandbox "))
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	env := newManager(t, stateDir, runDir, parent)
	ctx := context.Background()
	rep, err := env.m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Adopted) != 1 || rep.Adopted[0] != id {
		t.Fatalf("reconcile after kill -9: %+v, want %s adopted", rep, id)
	}
	t.Cleanup(func() { _, _ = env.m.Terminate(context.Background(), id, "test cleanup") })
	res, err := env.m.Exec(ctx, id, sandbox.ExecSpec{Argv: []string{"cat", "/workspace/before-kill"}, Timeout: time.Minute}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "written by the first daemon\n" {
		t.Fatalf("exec in the adopted VM: %+v %v", res, err)
	}
	if _, err := env.m.Terminate(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(runDir, "vms", id)); !os.IsNotExist(err) {
		t.Fatalf("vm dir left: %v", err)
	}
}

// runChildDaemon is the killed "daemon" of TestDaemonKilledVMAdopted.
func runChildDaemon() {
	t := &childT{}
	env := newManager(t, os.Getenv("VMTEST_DAEMON_STATE"), os.Getenv("VMTEST_DAEMON_RUN"), os.Getenv("VMTEST_DAEMON_CGROUP"))
	ctx := context.Background()
	info, err := env.m.Create(ctx, vmSpec(os.Getenv("VMTEST_DAEMON_IMAGE")))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child daemon:", err)
		os.Exit(1)
	}
	res, err := env.m.Exec(ctx, info.ID, sandbox.ExecSpec{Argv: []string{"sh", "-c", "echo written by the first daemon > /workspace/before-kill"}, Timeout: time.Minute}, nil)
	if err != nil || res.ExitCode != 0 {
		fmt.Fprintln(os.Stderr, "child daemon exec:", res, err)
		os.Exit(1)
	}
	fmt.Println("sandbox", info.ID)
	select {} // until SIGKILL
}

// childT is the testing.TB of the child daemon: failures end the process.
type childT struct{ testing.TB }

func (*childT) Helper()                      {}
func (*childT) Cleanup(func())               {}
func (*childT) Fatal(args ...any)            { fmt.Fprintln(os.Stderr, args...); os.Exit(1) }
func (*childT) Fatalf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...); os.Exit(1) }
func (*childT) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (*childT) Logf(f string, args ...any)   { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (*childT) Log(args ...any)              { fmt.Fprintln(os.Stderr, args...) }
func (*childT) Name() string                 { return "child-daemon" }
func (*childT) TempDir() string              { d, _ := os.MkdirTemp("", "child-"); return d }
