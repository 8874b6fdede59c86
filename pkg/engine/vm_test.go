package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// TestVMs drives VMs through the engine's sandbox operations on one engine
// with real QEMU (TCG here): the python guest image, sandbox_create
// {backend: vm} → exec → 1 MiB in and out → machine snapshot/restore →
// screenshot → max_vms → terminate leaves nothing,
// vm_test passing and failing (with a screenshot), run_code {backend: vm}
// with the container's result shape, and the bad-input taxonomy. VMs start
// from the fast-start snapshot after the first boot, so the boots are
// few: one template boot, then starts of a second or so.
func TestVMs(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("boots VMs (and builds the python guest image when it is not cached)")
	}
	env := newTestEngine(t, func(c *config.Config) { c.VM.MaxVMs = 1 })
	ctx := context.Background()
	createVM := func(req CreateSandboxRequest) (*sandbox.Info, error) {
		req.Backend = BackendVM
		return env.CreateSandbox(ctx, req)
	}
	t0 := time.Now()
	if _, err := env.EnsureVMImage(ctx, "python", io.Discard); err != nil {
		t.Fatal(err)
	}
	t.Logf("python guest image ready in %v", time.Since(t0))

	// Bad input, before any boot: each a taxonomy error naming its field.
	big, half := int64(64<<10), 1.5
	bad := []struct {
		name  string
		err   func() error
		code  errdefs.Code
		field string
	}{
		{"unknown os", func() error { _, err := createVM(CreateSandboxRequest{OS: "bsd"}); return err }, errdefs.InvalidArgument, "os:"},
		{"windows without image", func() error {
			_, err := createVM(CreateSandboxRequest{OS: "windows"})
			return err
		}, errdefs.Unavailable, "vm.images.windows"},
		{"memory over the cap", func() error {
			_, err := createVM(CreateSandboxRequest{MemoryMB: &big})
			return err
		}, errdefs.InvalidArgument, "memory_mb:"},
		{"fractional cpus", func() error { _, err := createVM(CreateSandboxRequest{CPUs: &half}); return err }, errdefs.InvalidArgument, "cpus:"},
		{"unknown image", func() error { _, err := createVM(CreateSandboxRequest{Image: "cobol"}); return err }, errdefs.InvalidArgument, "image:"},
		{"a container's field", func() error { _, err := createVM(CreateSandboxRequest{DiskMB: &big}); return err }, errdefs.InvalidArgument, "disk_mb:"},
		{"a VM with network", func() error { _, err := createVM(CreateSandboxRequest{Network: NetworkEgress}); return err }, errdefs.Unavailable, "network:"},
		{"unknown backend", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Backend: "bhyve", Language: "python"})
			return err
		}, errdefs.InvalidArgument, "backend:"},
		{"os of a container", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{OS: "windows", Language: "python"})
			return err
		}, errdefs.InvalidArgument, "os:"},
		{"snapshot name with /", func() error {
			_, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: "sb-x", Name: "a/b"})
			return err
		}, errdefs.InvalidArgument, "name:"},
		{"exec on no VM", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: "sb-nonexistent", Command: "true"}, nil)
			return err
		}, errdefs.NotFound, "sandbox_id:"},
		{"screenshot of no VM", func() error {
			_, err := env.ScreenshotSandbox(ctx, "sb-nonexistent")
			return err
		}, errdefs.NotFound, "sandbox_id:"},
		{"unknown run backend", func() error {
			_, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: "print(1)", Backend: "bhyve"}, nil)
			return err
		}, errdefs.InvalidArgument, "backend:"},
		{"vm_test without tests", func() error { _, err := env.VMTest(ctx, apitypes.VMTestRequest{Image: "python"}); return err }, errdefs.InvalidArgument, "test:"},
	}
	for _, b := range bad {
		err := b.err()
		if !errdefs.Is(err, b.code) || !strings.Contains(err.Error(), b.field) {
			t.Errorf("%s: got %v, want %s naming %q", b.name, err, b.code, b.field)
		}
	}

	t0 = time.Now()
	v, err := createVM(CreateSandboxRequest{Image: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if v.VM == nil {
		t.Fatalf("created VM without vm: %+v", v)
	}
	t.Logf("vm %s ready in %v (accel %s; the first start boots the fast-start template)", v.ID, time.Since(t0), v.VM.Accel)
	if v.Backend != BackendVM || v.Language != "python" || v.Image != "vm-python" || v.VM.Accel == "" || v.Limits.MemoryBytes != vmDefaultMemoryMiB<<20 {
		t.Errorf("created VM: %+v", v)
	}
	if v.VM.OS != "linux" || v.VM.GuestAgent != apitypes.GuestAgentSandbox ||
		!slices.Equal(v.Capabilities, []string{"exec", "jobs", "pty", "files", "file_list", "ports", "memory_snapshot", "screenshot", "pause"}) {
		t.Errorf("created VM's os, guest agent and capabilities: %+v %v", v.VM, v.Capabilities)
	}
	vmCheck := func() Check {
		for _, c := range env.Readiness(ctx) {
			if c.Name == "vm" {
				return c
			}
		}
		return Check{}
	}
	if c := vmCheck(); c.Status != CheckOK || !strings.Contains(c.Reason, "kvm: ") || !strings.Contains(c.Reason, "accel: "+v.VM.Accel) {
		t.Errorf("readiness vm: %+v", c)
	}
	if _, err := createVM(CreateSandboxRequest{Image: "python"}); !errdefs.Is(err, errdefs.LimitExceeded) || !strings.Contains(err.Error(), "vm.max_vms") {
		t.Errorf("a VM over vm.max_vms: %v", err)
	}
	if l := listVMs(t, env, ""); len(l) != 1 || l[0].ID != v.ID || l[0].VM == nil || l[0].VM.OS != "linux" {
		t.Errorf("sandbox_list's VMs: %v", l)
	}

	res, err := env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "uname -r; id -u; pwd"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !regexp.MustCompile(`^\d+\.\d+\S*-cloud-amd64\n1000\n/workspace\n$`).MatchString(res.Stdout) {
		t.Errorf("uname -r; id -u; pwd: %+v", res)
	}
	res, err = env.Exec(ctx, ExecRequest{SandboxID: v.ID, Argv: []string{"python3", "-c", "import pytest; print(pytest.__name__)"}}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "pytest\n" {
		t.Errorf("python3 with pytest in the guest: %+v %v", res, err)
	}

	// 1 MiB of random bytes in and out, byte for byte.
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/workspace/blob", Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64"}); err != nil {
		t.Fatal(err)
	}
	fr, err := env.ReadFile(ctx, FileReadRequest{SandboxID: v.ID, Path: "/workspace/blob", Encoding: "base64", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := base64.StdEncoding.DecodeString(fr.Content); !bytes.Equal(got, data) || fr.Truncated {
		t.Errorf("1 MiB file: got %d bytes back (truncated %v), equal %v", len(got), fr.Truncated, bytes.Equal(got, data))
	}

	// A file listing and a background job: our agent in the guest.
	if l, err := env.ListFiles(ctx, v.ID, "/workspace", false); err != nil || !slices.ContainsFunc(l, func(f FileEntry) bool { return f.Path == "/workspace/blob" && f.Size == 1<<20 }) {
		t.Errorf("file_list in the VM: %+v %v", l, err)
	}
	job, err := env.StartJob(ctx, ExecRequest{SandboxID: v.ID, Command: "echo job"})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded by the boot budget (derived from the host's contention), not
	// a fixed 30 s: the guest's scheduler starves with the host's.
	for deadline := time.Now().Add(vm.BootBudget("")); ; time.Sleep(50 * time.Millisecond) {
		st, err := env.JobStatus(ctx, JobStatusRequest{SandboxID: v.ID, JobID: job})
		if err != nil || st.State == "finished" || time.Now().After(deadline) {
			if err != nil || st.State != "finished" || st.Stdout != "job\n" || st.ExitCode == nil || *st.ExitCode != 0 {
				t.Errorf("a job in the VM: %+v %v", st, err)
			}
			break
		}
	}

	// Snapshot (the whole machine: a VM has no workspace snapshots), write,
	// restore: the file is gone.
	snap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: v.ID, Name: "clean"})
	if err != nil || snap.Kind != apitypes.SnapshotMemory || snap.Name != "clean" || snap.ID != machineSnapshotID(v.ID, "clean") {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	if names, err := env.sandboxes.MachineSnapshots(ctx, v.ID); err != nil || !slices.Contains(names, "clean") {
		t.Fatalf("machine snapshots: %v %v", names, err)
	}
	if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/workspace/after.txt", Content: "later"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: v.ID, SnapshotID: machineSnapshotID(v.ID, "nope")}); !errdefs.Is(err, errdefs.NotFound) || !strings.Contains(err.Error(), "snapshot_id:") {
		t.Errorf("restore of an unknown snapshot: %v", err)
	}
	if _, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: v.ID, SnapshotID: snap.ID}); err != nil {
		t.Fatal(err)
	}
	res, err = env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "test -e /workspace/after.txt; echo $?; test -e /workspace/blob; echo $?"}, nil)
	if err != nil || res.Stdout != "1\n0\n" {
		t.Errorf("after restore (after.txt gone, blob kept): %+v %v", res, err)
	}
	if g, err := env.GetSandbox(ctx, v.ID); err != nil || g.VM == nil || !slices.Contains(g.VM.Snapshots, "clean") {
		t.Errorf("sandbox_get's VM snapshots: %+v %v", g, err)
	}
	// Pause stops the VM's vCPUs: commands and a restore wait for the
	// resume, after which it runs on where it was.
	if p, err := env.PauseSandbox(ctx, v.ID); err != nil || p.State != sandbox.StatePaused {
		t.Fatalf("pause of a VM: %+v %v", p, err)
	}
	if _, err := env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "paused") {
		t.Errorf("exec on a paused VM: %v", err)
	}
	if _, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: v.ID, SnapshotID: snap.ID}); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "resume it") {
		t.Errorf("restore of a paused VM: %v", err)
	}
	if r, err := env.ResumeSandbox(ctx, v.ID); err != nil || r.State != sandbox.StateReady {
		t.Fatalf("resume of a VM: %+v %v", r, err)
	}
	if res, err := env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "cat /workspace/blob | wc -c"}, nil); err != nil || res.Stdout != "1048576\n" {
		t.Errorf("exec after resume: %+v %v", res, err)
	}

	shot, err := env.ScreenshotSandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(shot)); err != nil || img.Bounds().Dx() < 320 {
		t.Errorf("screenshot: %v", err)
	}

	// Terminate leaves no QEMU process, socket, overlay or cgroup.
	dir := filepath.Join(env.cfg.Paths.RunDir, "vms", v.ID)
	var rec struct {
		PID int `json:"pid"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "vm.json")); err != nil || json.Unmarshal(b, &rec) != nil || rec.PID == 0 {
		t.Fatalf("vm.json: %v", err)
	}
	if d, err := env.TerminateSandbox(ctx, v.ID); err != nil || d.State != sandbox.StateTerminated {
		t.Fatalf("terminate: %+v %v", d, err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(rec.PID))); err == nil {
		t.Errorf("qemu pid %d still exists after destroy", rec.PID)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("VM dir %s (overlay, sockets) left: %v", dir, err)
	}
	for _, cg := range testenv.CgroupDirs(env.cfg.Sandbox.CgroupParent + "/vms/" + v.ID) {
		if _, err := os.Stat(cg); err == nil {
			t.Errorf("VM cgroup %s left", cg)
		}
	}
	if _, err := env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "sandbox "+v.ID+" is terminated") {
		t.Errorf("exec on a terminated VM: %v", err)
	}

	// vm_test: a small Python project with a pytest suite, passing then failing.
	project := map[string]string{
		"calc.py":            "def add(a, b):\n    return a + b\n",
		"tests/test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n",
	}
	pytest := "python3 -m pytest -q -p no:cacheprovider"
	t0 = time.Now()
	tr, err := env.VMTest(ctx, apitypes.VMTestRequest{Image: "python", Files: project,
		Setup: []string{"python3 -c 'import calc'"}, Test: []string{"PYTHONPATH=. " + pytest}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm_test (passing) in %v", time.Since(t0))
	if !tr.Passed || tr.FailedStep != -1 || len(tr.Steps) != 2 || tr.Steps[1].Phase != "test" || !strings.Contains(tr.Steps[1].Stdout, "1 passed") || tr.Screenshot != nil || !tr.Destroyed {
		t.Errorf("passing vm_test: %+v", tr)
	}
	run, err := env.GetRun(ctx, tr.RunID, 0)
	if err != nil || run.Metadata.Kind != "vm_test" || !run.Metadata.Success || run.Code["tests/test_calc.py"] == "" {
		t.Errorf("vm_test run record: %+v %v", run, err)
	}
	project["tests/test_calc.py"] += "\ndef test_broken():\n    assert add(2, 2) == 5\n"
	tr, err = env.VMTest(ctx, apitypes.VMTestRequest{Image: "python", Files: project, Test: []string{"PYTHONPATH=. " + pytest, "echo never"}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Passed || tr.FailedStep != 0 || len(tr.Steps) != 1 || !strings.Contains(tr.Steps[0].Stdout, "1 failed") || !strings.Contains(tr.Steps[0].Stdout, "test_broken") {
		t.Errorf("failing vm_test: %+v", tr)
	}
	if _, err := png.Decode(bytes.NewReader(tr.Screenshot)); err != nil {
		t.Errorf("failing vm_test screenshot: %v", err)
	}
	if run, err := env.GetRun(ctx, tr.RunID, 0); err != nil || run.Metadata.Success {
		t.Errorf("failing vm_test record: %+v %v", run, err)
	} else if _, err := os.Stat(filepath.Join(run.Dir, "screenshot.png")); err != nil {
		t.Errorf("screenshot in the run record: %v", err)
	}

	// run_code in a VM: the same result shape as in a container.
	testenv.EnsureImages(t, "python")
	code := "import sys, platform\nprint('hello', platform.system())\nprint('err', file=sys.stderr)\n"
	inVM, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: code, Backend: BackendVM}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inCt, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !inVM.Success || inVM.Stdout != "hello Linux\n" || inVM.Stderr != "err\n" || inVM.Stdout != inCt.Stdout {
		t.Errorf("run_code backend vm: %+v (container: %+v)", inVM, inCt)
	}
	if kv, kc := jsonKeys(t, inVM), jsonKeys(t, inCt); !slices.Equal(kv, kc) {
		t.Errorf("run_code result keys: vm %v, container %v", kv, kc)
	}
	if sb, err := env.sandboxes.Get(ctx, inVM.SandboxID); err != nil || sb.Backend != BackendVM || sb.State != sandbox.StateTerminated {
		t.Errorf("run_code's VM: %+v %v", sb, err)
	}
	if l := listVMs(t, env, ""); len(l) != 0 {
		t.Errorf("VMs left live: %v", l)
	}

	// A VM whose QEMU died (killed from the host) is no longer live: exec
	// on it is a conflict naming the sandbox.
	v, err = createVM(CreateSandboxRequest{Image: "python"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(env.cfg.Paths.RunDir, "vms", v.ID, "vm.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("vm.json: %v", err)
	}
	if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(vm.BootBudget("")); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if g, err := env.GetSandbox(ctx, v.ID); err == nil && !g.State.Live() {
			break
		}
	}
	if _, err := env.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "sandbox "+v.ID+" is ") {
		t.Errorf("exec on a VM whose QEMU died: %v", err)
	}
	if _, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: v.ID, Name: "x"}); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("snapshot of a stopped VM: %v", err)
	}
}

// listVMs is sandbox_list's VMs in state.
func listVMs(t *testing.T, e interface {
	ListSandboxes(context.Context, string) ([]*sandbox.Info, error)
}, state string) []*sandbox.Info {
	t.Helper()
	all, err := e.ListSandboxes(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(all, func(s *sandbox.Info) bool { return s.Backend != BackendVM })
}

func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
