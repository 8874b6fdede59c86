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
)

// TestVMs drives the VM surface of the engine on one engine with real
// QEMU (TCG here): the python guest image, vm_create → exec → 1 MiB in and
// out → snapshot/restore → screenshot → max_vms → destroy leaves nothing,
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
		{"unknown os", func() error { _, err := env.CreateVM(ctx, apitypes.VMCreateRequest{OS: "bsd"}, nil); return err }, errdefs.InvalidArgument, "os:"},
		{"windows without image", func() error {
			_, err := env.CreateVM(ctx, apitypes.VMCreateRequest{OS: "windows"}, nil)
			return err
		}, errdefs.Unavailable, "vm.images.windows"},
		{"memory over the cap", func() error {
			_, err := env.CreateVM(ctx, apitypes.VMCreateRequest{MemoryMB: &big}, nil)
			return err
		}, errdefs.InvalidArgument, "memory_mb:"},
		{"fractional cpus", func() error { _, err := env.CreateVM(ctx, apitypes.VMCreateRequest{CPUs: &half}, nil); return err }, errdefs.InvalidArgument, "cpus:"},
		{"unknown image", func() error { _, err := env.CreateVM(ctx, apitypes.VMCreateRequest{Image: "cobol"}, nil); return err }, errdefs.InvalidArgument, "image:"},
		{"snapshot name with /", func() error {
			_, err := env.SnapshotVM(ctx, apitypes.VMSnapshotRequest{VMID: "sb-x", Name: "a/b"})
			return err
		}, errdefs.InvalidArgument, "name:"},
		{"exec on no VM", func() error {
			_, err := env.VMExec(ctx, apitypes.VMExecRequest{VMID: "sb-nonexistent", Command: "true"}, nil)
			return err
		}, errdefs.NotFound, "vm_id:"},
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
	v, err := env.CreateVM(ctx, apitypes.VMCreateRequest{Image: "python"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm %s ready in %v (accel %s; the first start boots the fast-start template)", v.ID, time.Since(t0), v.Accel)
	if v.Backend != BackendVM || v.Language != "python" || v.Image != "vm-python" || v.Accel == "" || v.Limits.MemoryBytes != vmDefaultMemoryMiB<<20 {
		t.Errorf("created VM: %+v", v)
	}
	vmCheck := func() Check {
		for _, c := range env.Readiness(ctx) {
			if c.Name == "vm" {
				return c
			}
		}
		return Check{}
	}
	if c := vmCheck(); c.Status != CheckOK || !strings.Contains(c.Reason, "kvm: ") || !strings.Contains(c.Reason, "accel: "+v.Accel) {
		t.Errorf("readiness vm: %+v", c)
	}
	if _, err := env.CreateVM(ctx, apitypes.VMCreateRequest{Image: "python"}, nil); !errdefs.Is(err, errdefs.LimitExceeded) || !strings.Contains(err.Error(), "vm.max_vms") {
		t.Errorf("a VM over vm.max_vms: %v", err)
	}
	if l, err := env.ListVMs(ctx, ""); err != nil || len(l) != 1 || l[0].ID != v.ID {
		t.Errorf("vm_list: %v %v", l, err)
	}

	res, err := env.VMExec(ctx, apitypes.VMExecRequest{VMID: v.ID, Command: "uname -r; id -u; pwd"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !regexp.MustCompile(`^\d+\.\d+\S*-cloud-amd64\n1000\n/workspace\n$`).MatchString(res.Stdout) {
		t.Errorf("uname -r; id -u; pwd: %+v", res)
	}
	res, err = env.VMExec(ctx, apitypes.VMExecRequest{VMID: v.ID, Argv: []string{"python3", "-c", "import pytest; print(pytest.__name__)"}}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "pytest\n" {
		t.Errorf("python3 with pytest in the guest: %+v %v", res, err)
	}

	// 1 MiB of random bytes in and out, byte for byte.
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	if _, err := env.VMWriteFile(ctx, apitypes.VMFileWriteRequest{VMID: v.ID, Path: "/workspace/blob", Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64"}); err != nil {
		t.Fatal(err)
	}
	fr, err := env.VMReadFile(ctx, apitypes.VMFileReadRequest{VMID: v.ID, Path: "/workspace/blob", Encoding: "base64", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := base64.StdEncoding.DecodeString(fr.Content); !bytes.Equal(got, data) || fr.Truncated {
		t.Errorf("1 MiB file: got %d bytes back (truncated %v), equal %v", len(got), fr.Truncated, bytes.Equal(got, data))
	}

	// Snapshot, write, restore: the file is gone.
	snap, err := env.SnapshotVM(ctx, apitypes.VMSnapshotRequest{VMID: v.ID, Name: "clean"})
	if err != nil || !slices.Contains(snap.Snapshots, "clean") {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	if _, err := env.VMWriteFile(ctx, apitypes.VMFileWriteRequest{VMID: v.ID, Path: "/workspace/after.txt", Content: "later"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.RestoreVM(ctx, apitypes.VMSnapshotRequest{VMID: v.ID, Name: "nope"}); !errdefs.Is(err, errdefs.NotFound) || !strings.Contains(err.Error(), "name:") {
		t.Errorf("restore of an unknown snapshot: %v", err)
	}
	if _, err := env.RestoreVM(ctx, apitypes.VMSnapshotRequest{VMID: v.ID, Name: "clean"}); err != nil {
		t.Fatal(err)
	}
	res, err = env.VMExec(ctx, apitypes.VMExecRequest{VMID: v.ID, Command: "test -e /workspace/after.txt; echo $?; test -e /workspace/blob; echo $?"}, nil)
	if err != nil || res.Stdout != "1\n0\n" {
		t.Errorf("after restore (after.txt gone, blob kept): %+v %v", res, err)
	}
	if g, err := env.GetVM(ctx, v.ID); err != nil || !slices.Contains(g.Snapshots, "clean") {
		t.Errorf("vm_get snapshots: %+v %v", g, err)
	}

	shot, err := env.ScreenshotVM(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(shot)); err != nil || img.Bounds().Dx() < 320 {
		t.Errorf("screenshot: %v", err)
	}

	// Destroy leaves no QEMU process, socket, overlay or cgroup.
	dir := filepath.Join(env.cfg.Paths.RunDir, "vms", v.ID)
	var rec struct {
		PID int `json:"pid"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "vm.json")); err != nil || json.Unmarshal(b, &rec) != nil || rec.PID == 0 {
		t.Fatalf("vm.json: %v", err)
	}
	if d, err := env.DestroyVM(ctx, v.ID); err != nil || d.State != sandbox.StateTerminated {
		t.Fatalf("destroy: %+v %v", d, err)
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
	if _, err := env.VMExec(ctx, apitypes.VMExecRequest{VMID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "vm_id:") {
		t.Errorf("exec on a destroyed VM: %v", err)
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
	if l, err := env.ListVMs(ctx, ""); err != nil || len(l) != 0 {
		t.Errorf("VMs left live: %v %v", l, err)
	}

	// A VM whose QEMU died (killed from the host) is no longer live: exec
	// on it is a conflict naming vm_id.
	v, err = env.CreateVM(ctx, apitypes.VMCreateRequest{Image: "python"}, nil)
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
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if g, err := env.GetVM(ctx, v.ID); err == nil && !g.State.Live() {
			break
		}
	}
	if _, err := env.VMExec(ctx, apitypes.VMExecRequest{VMID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "vm_id:") {
		t.Errorf("exec on a VM whose QEMU died: %v", err)
	}
	if _, err := env.SnapshotVM(ctx, apitypes.VMSnapshotRequest{VMID: v.ID, Name: "x"}); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("snapshot of a stopped VM: %v", err)
	}
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
