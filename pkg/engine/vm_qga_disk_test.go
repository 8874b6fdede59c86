package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// qgaTestDisk is the administrator's Linux disk of the QGA tests: the
// Linux test guest made into a disk that boots by itself through UEFI
// (vm.MakeBootDisk: GRUB on an ESP, the guest's kernel and root), whose
// guest runs only Debian's qemu-ga (a disk guest gets no sandbox-agent
// port, so the guest's init starts no agent).
func qgaTestDisk(t *testing.T) string {
	t.Helper()
	g := vmenv.Guest(t)
	out := filepath.Join(t.TempDir(), "admin-linux.qcow2")
	t0 := time.Now()
	if err := vm.MakeBootDisk(context.Background(), g, out); err != nil {
		t.Fatalf("make the boot disk: %v", err)
	}
	t.Logf("boot disk made in %v", time.Since(t0))
	return out
}

// TestVMQGALinuxDisk drives a VM of an administrator's Linux disk
// (vm.images.linux) through the engine with real QEMU (TCG here) and the
// guest's real qemu-ga, all through the sandbox operations: ready through
// QGA, exec_command with argv, a shell
// command with a non-zero exit and stderr, env and stdin, a 1 MiB file in
// and out byte for byte (and a page of it), a command killed at its
// timeout (its process tree gone), machine snapshot/restore, a PNG
// screenshot, the operations qemu-ga cannot do refused naming the
// capability, a daemon restart that adopts the VM (QGA reconnected) and
// terminate leaving nothing.
func TestVMQGALinuxDisk(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("boots a VM under TCG")
	}
	disk := qgaTestDisk(t)
	cfg := testenv.Config(t, "qga")
	testenv.EnsureImages(t, "shell")
	cfg.VM.MaxVMs = 1
	cfg.VM.Images = map[string]string{vm.OSLinux: disk}
	ctx := context.Background()
	e1, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			e1.sandboxes.Close()
			for _, id := range e1.sandboxes.IDs() {
				_, _ = e1.TerminateSandbox(ctx, id)
			}
			_ = e1.Close()
		}
	})

	var progress []string
	t0 := time.Now()
	v, err := e1.CreateSandboxProgress(ctx, CreateSandboxRequest{Backend: BackendVM, Env: map[string]string{"VMVAR": "from-vm"}}, func(l string) { progress = append(progress, l) })
	if err != nil {
		t.Fatal(err)
	}
	if v.VM == nil {
		t.Fatalf("created VM without vm: %+v", v)
	}
	t.Logf("QGA disk VM %s ready in %v (accel %s)", v.ID, time.Since(t0), v.VM.Accel)
	if v.VM.OS != vm.OSLinux || v.VM.GuestAgent != apitypes.GuestAgentQGA || v.Image != disk || v.Language != vm.OSLinux ||
		v.Limits.MemoryBytes != 1024<<20 || len(progress) != 1 {
		t.Errorf("created VM: %+v, progress %q", v, progress)
	}
	if !slices.Equal(v.Capabilities, []string{"exec", "files", "memory_snapshot", "screenshot"}) {
		t.Errorf("a qemu-ga guest's capabilities: %v", v.Capabilities)
	}

	run := func(e *Engine, req ExecRequest) *sandbox.ExecResult {
		t.Helper()
		req.SandboxID = v.ID
		res, err := e.Exec(ctx, req, nil)
		if err != nil {
			t.Fatalf("exec_command %q %q: %v", req.Command, req.Argv, err)
		}
		return res
	}
	res := run(e1, ExecRequest{Argv: []string{"uname", "-r"}})
	if res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, "-cloud-amd64\n") || res.Termination.Cause != sandbox.CauseExited {
		t.Errorf("uname -r: %+v", res)
	}
	var rtt []time.Duration
	for range 5 {
		t1 := time.Now()
		run(e1, ExecRequest{Argv: []string{"true"}})
		rtt = append(rtt, time.Since(t1))
	}
	t.Logf("exec_command true through qemu-ga: median %v of %v", median(rtt), rtt)
	res = run(e1, ExecRequest{Command: "echo out; echo err >&2; echo $VMVAR $REQVAR; cat; exit 3",
		Env: map[string]string{"REQVAR": "from-req"}, Stdin: "piped\n"})
	if res.ExitCode != 3 || res.Stdout != "out\nfrom-vm from-req\npiped\n" || res.Stderr != "err\n" ||
		res.Termination.Cause != sandbox.CauseExited || *res.Termination.ExitCode != 3 {
		t.Errorf("command with exit 3 and stderr: %+v", res)
	}

	// A working directory (a shell changes to it, then execs the command):
	// a command, argv, and a directory that does not exist.
	if res = run(e1, ExecRequest{Command: "pwd", Cwd: "/var/tmp"}); res.Stdout != "/var/tmp\n" || res.ExitCode != 0 {
		t.Errorf("command in cwd /var/tmp: %+v", res)
	}
	if res = run(e1, ExecRequest{Argv: []string{"pwd"}, Cwd: "/etc"}); res.Stdout != "/etc\n" || res.ExitCode != 0 {
		t.Errorf("argv in cwd /etc: %+v", res)
	}
	if res = run(e1, ExecRequest{Command: "echo never", Cwd: "/nonexistent"}); res.ExitCode != 125 || res.Stdout != "" || !strings.Contains(res.Stderr, "/nonexistent") {
		t.Errorf("command in a missing cwd: %+v", res)
	}

	// A timed-out command: killed with its process tree, its output kept.
	t1 := time.Now()
	timeout := 2.0
	res = run(e1, ExecRequest{Command: "echo started; sleep 1017 & sleep 1019; echo never", TimeoutSeconds: &timeout})
	if res.Termination.Cause != sandbox.CauseTimeout || res.Stdout != "started\n" || res.ExitCode != -1 || time.Since(t1) > 30*time.Second {
		t.Errorf("timed-out command after %v: %+v", time.Since(t1), res)
	}
	res = run(e1, ExecRequest{Command: "grep -l '^sleep$' /proc/[0-9]*/comm 2>/dev/null | wc -l"})
	if strings.TrimSpace(res.Stdout) != "0" {
		t.Errorf("sleeps of the timed-out command left: %+v", res)
	}

	// 1 MiB of random bytes in and out, byte for byte; the parent is made.
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	if w, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/root/qga/blob", Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64"}); err != nil || w.Size != 1<<20 {
		t.Fatalf("write 1 MiB: %+v %v", w, err)
	}
	fr, err := e1.ReadFile(ctx, FileReadRequest{SandboxID: v.ID, Path: "/root/qga/blob", Encoding: "base64", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := base64.StdEncoding.DecodeString(fr.Content); !bytes.Equal(got, data) || fr.Truncated || fr.Size != 1<<20 {
		t.Errorf("1 MiB file: got %d bytes back (truncated %v, size %d), equal %v", len(got), fr.Truncated, fr.Size, bytes.Equal(got, data))
	}
	fr, err = e1.ReadFile(ctx, FileReadRequest{SandboxID: v.ID, Path: "/root/qga/blob", Encoding: "base64", Offset: 1<<20 - 10, MaxBytes: 4})
	if got, _ := base64.StdEncoding.DecodeString(fr.Content); err != nil || !bytes.Equal(got, data[1<<20-10:1<<20-6]) || !fr.Truncated || fr.NextOffset != 1<<20-6 {
		t.Errorf("a page of the file: %+v %v", fr, err)
	}
	if res := run(e1, ExecRequest{Command: "sha256sum < /root/qga/blob"}); !strings.HasPrefix(res.Stdout, fmt.Sprintf("%x", sha256.Sum256(data))) {
		t.Errorf("sha256 in the guest: %+v", res)
	}
	// A mode is set with chmod after the write.
	if _, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/root/hello.sh", Content: "#!/bin/sh\necho hi\n", Mode: "0750"}); err != nil {
		t.Fatal(err)
	}
	if res := run(e1, ExecRequest{Command: "stat -c %a /root/hello.sh; /root/hello.sh"}); res.Stdout != "750\nhi\n" {
		t.Errorf("a file written with mode 0750: %+v", res)
	}

	// Bad input, and the operations qemu-ga cannot do: taxonomy errors, at
	// once; a refusal names the sandbox, the capability and why.
	for name, c := range map[string]struct {
		err   func() error
		code  errdefs.Code
		field string
	}{
		"relative path": {func() error {
			_, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "x.txt", Content: "x"})
			return err
		}, errdefs.InvalidArgument, "path:"},
		"setuid mode": {func() error {
			_, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/root/x", Content: "x", Mode: "4755"})
			return err
		}, errdefs.InvalidArgument, "mode:"},
		"relative cwd": {func() error {
			_, err := e1.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "pwd", Cwd: "root"}, nil)
			return err
		}, errdefs.InvalidArgument, "cwd:"},
		"missing file": {func() error {
			_, err := e1.ReadFile(ctx, FileReadRequest{SandboxID: v.ID, Path: "/nonexistent"})
			return err
		}, errdefs.NotFound, "path:"},
		"append": {func() error {
			_, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/root/x", Content: "x", Append: true})
			return err
		}, errdefs.Unavailable, "append:"},
		"background job": {func() error {
			_, err := e1.StartJob(ctx, ExecRequest{SandboxID: v.ID, Command: "true"})
			return err
		}, errdefs.Unavailable, "lacks the jobs capability"},
		"file_list": {func() error {
			_, err := e1.ListFiles(ctx, v.ID, "/root", false)
			return err
		}, errdefs.Unavailable, "lacks the file_list capability"},
		"files_export": {func() error {
			_, err := e1.ExportFiles(ctx, v.ID, "/root")
			return err
		}, errdefs.Unavailable, "lacks the file_list capability"},
		"terminal": {func() error {
			_, err := e1.OpenTerminal(ctx, TerminalRequest{SandboxID: v.ID})
			return err
		}, errdefs.Unavailable, "lacks the pty capability"},
		"sandbox_pause": {func() error {
			_, err := e1.PauseSandbox(ctx, v.ID)
			return err
		}, errdefs.Unavailable, "lacks the pause capability"},
		"sandbox_expose_port": {func() error {
			_, err := e1.ExposePort(ctx, ExposePortRequest{SandboxID: v.ID, Port: 8080})
			return err
		}, errdefs.Unavailable, "lacks the ports capability"},
	} {
		t2 := time.Now()
		err := c.err()
		if !errdefs.Is(err, c.code) || !strings.Contains(err.Error(), c.field) || time.Since(t2) > 10*time.Second {
			t.Errorf("%s: got %v after %v, want %s naming %q", name, err, time.Since(t2), c.code, c.field)
		}
		if c.code == errdefs.Unavailable && c.field != "append:" && (!strings.Contains(err.Error(), "sandbox "+v.ID) || !strings.Contains(err.Error(), "only the QEMU guest agent")) {
			t.Errorf("%s: the refusal does not name the sandbox and why: %v", name, err)
		}
	}

	// Snapshot (the whole machine), write, restore: the file is gone,
	// qemu-ga answers again.
	snap, err := e1.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: v.ID, Name: "clean"})
	if err != nil || snap.Kind != apitypes.SnapshotMemory {
		t.Fatalf("sandbox_snapshot of a qemu-ga guest: %+v %v", snap, err)
	}
	if _, err := e1.WriteFile(ctx, FileWriteRequest{SandboxID: v.ID, Path: "/root/after.txt", Content: "later"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e1.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: v.ID, SnapshotID: snap.ID}); err != nil {
		t.Fatal(err)
	}
	if res := run(e1, ExecRequest{Command: "test -e /root/after.txt; echo $?; test -e /root/qga/blob; echo $?"}); res.Stdout != "1\n0\n" {
		t.Errorf("after restore (after.txt gone, blob kept): %+v", res)
	}
	shot, err := e1.ScreenshotSandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
		t.Errorf("screenshot: %v", err)
	}

	// A daemon restart: the VM is adopted and qemu-ga reconnected.
	dir := filepath.Join(cfg.Paths.RunDir, "vms", v.ID)
	var rec vmRecord
	if b, err := os.ReadFile(filepath.Join(dir, "vm.json")); err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("vm.json: %v", err)
	}
	e1.sandboxes.Close()
	if err := e1.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	t0 = time.Now()
	e2, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	watchEngine(t, e2, cfg)
	t.Logf("engine re-created (VM adopted) in %v", time.Since(t0))
	if g, err := e2.GetSandbox(ctx, v.ID); err != nil || !g.State.Live() || g.VM == nil || g.VM.GuestAgent != apitypes.GuestAgentQGA || g.VM.OS != vm.OSLinux || !slices.Contains(g.VM.Snapshots, "clean") {
		t.Fatalf("adopted VM: %+v %v", g, err)
	}
	if res := run(e2, ExecRequest{Argv: []string{"cat", "/proc/sys/kernel/osrelease"}}); res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, "-cloud-amd64\n") {
		t.Errorf("exec_command after the restart: %+v", res)
	}

	// Terminate leaves no QEMU process, socket, overlay, cgroup or ledger row.
	if d, err := e2.TerminateSandbox(ctx, v.ID); err != nil || d.State != sandbox.StateTerminated || d.VM == nil || d.VM.OS != vm.OSLinux {
		t.Fatalf("terminate: %+v %v", d, err)
	}
	if pidAlive(rec.PID) {
		t.Errorf("qemu pid %d still runs after destroy", rec.PID)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("VM dir %s left: %v", dir, err)
	}
	for _, cg := range testenv.CgroupDirs(cfg.Sandbox.CgroupParent + "/vms/" + v.ID) {
		if _, err := os.Stat(cg); err == nil {
			t.Errorf("VM cgroup %s left", cg)
		}
	}
	if owners, err := e2.ledger.Owners(ctx); err != nil || slices.Contains(owners, v.ID) {
		t.Errorf("ledger rows left: %v %v", owners, err)
	}
	if _, err := e2.Exec(ctx, ExecRequest{SandboxID: v.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "sandbox "+v.ID+" is terminated") {
		t.Errorf("exec on a terminated VM: %v", err)
	}

	// vm_test on the disk guest: files and steps through qemu-ga in a
	// directory of the run, stopping at the failing step, a screenshot,
	// the record, the VM destroyed.
	t0 = time.Now()
	tr, err := e2.VMTest(ctx, apitypes.VMTestRequest{Files: map[string]string{"a.txt": "x", "sub/b.txt": "y"},
		Env: map[string]string{"GREETING": "hi"}, Setup: []string{"test -s a.txt"},
		Test: []string{"cat sub/b.txt; echo $GREETING", "echo boom; exit 2", "echo never"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm_test on the disk guest in %v", time.Since(t0))
	if tr.Passed || tr.FailedStep != 2 || len(tr.Steps) != 3 || tr.Steps[0].ExitCode != 0 || tr.Steps[1].Stdout != "yhi\n" ||
		tr.Steps[2].ExitCode != 2 || tr.Steps[2].Stdout != "boom\n" || !tr.Destroyed {
		t.Errorf("vm_test on the disk guest: %+v", tr)
	}
	if _, err := png.Decode(bytes.NewReader(tr.Screenshot)); err != nil {
		t.Errorf("vm_test screenshot: %v", err)
	}
	if rr, err := e2.GetRun(ctx, tr.RunID, 0); err != nil || rr.Metadata.Kind != "vm_test" || rr.Metadata.Success || rr.Code["sub/b.txt"] != "y" || len(rr.Metadata.Steps) != 3 {
		t.Errorf("vm_test run record: %+v %v", rr, err)
	}
}
