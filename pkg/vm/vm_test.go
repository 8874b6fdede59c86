package vm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// VM tests boot real guests under QEMU (TCG on hosts without a working
// KVM). Boots are the expensive part: each test boots once, and the
// checks of a running VM share that boot.

// newSpec returns a spec with a short state dir under /run (socket paths)
// and a private cgroup, both removed when the test ends.
func newSpec(t *testing.T, g *vm.Guest) vm.Spec {
	t.Helper()
	base, err := os.MkdirTemp("/run", "vmt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	parent := "/mcp-sandboxd-vmtest-" + testenv.RandHex(4)
	t.Cleanup(func() { testenv.RemoveCgroupParent(t, parent) })
	id := "vm-" + testenv.RandHex(4)
	return vm.Spec{
		ID:        id,
		Dir:       filepath.Join(base, id),
		Guest:     g,
		MemoryMiB: 256,
		CPUs:      1,
		Cgroup:    parent + "/" + id,
		RunAs:     "nobody",
	}
}

// start boots s to a ready guest agent within the boot budget derived for
// this host now (vm.BootBudget), not a fixed deadline: a busy host boots
// many times slower.
func start(t *testing.T, s vm.Spec) (*vm.VM, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vm.BootBudget(s.Accel))
	defer cancel()
	t0 := time.Now()
	v, err := vm.Start(ctx, s)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = v.Destroy(context.Background()) })
	if err := v.WaitReady(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	return v, time.Since(t0)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// sh runs a shell command in the guest through qemu-ga.
func sh(t *testing.T, v *vm.VM, cmd string) *qga.ExecResult {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	c, err := v.QGA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path, args, _ := qga.ShellCommand("linux", cmd)
	res, err := c.Exec(ctx, qga.ExecRequest{Path: path, Args: args})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

func TestVMLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	g := vmenv.Guest(t)
	accel, reason := vm.DetectAccel(vm.DefaultQEMU, g.Kernel)
	t.Logf("accelerator %s: %s", accel, reason)
	s := newSpec(t, g)
	v, boot := start(t, s)
	t.Logf("cold boot to ready agent: %v (%s)", boot, v.Accel())

	t.Run("exec", func(t *testing.T) {
		res := sh(t, v, "uname -r; echo err >&2; exit 3")
		if got := strings.TrimSpace(string(res.Stdout)); got != g.Release || string(res.Stderr) != "err\n" || res.ExitCode != 3 {
			t.Fatalf("uname -r: %q / %q / %d, want %q", res.Stdout, res.Stderr, res.ExitCode, g.Release)
		}
		// The layout of a container sandbox: user 1000, writable /workspace and /tmp.
		res = sh(t, v, "id -u sandbox; stat -c %u /workspace; stat -c %a /tmp")
		if got := string(res.Stdout); got != "1000\n1000\n1777\n" {
			t.Fatalf("layout: %q", got)
		}
	})

	t.Run("sandbox-agent over virtio-serial", func(t *testing.T) {
		// The container sandbox's protocol, one yamux stream per request.
		ctx := ctxT(t, time.Minute)
		c := agent.NewClient(v.DialAgent)
		info, err := c.Ping(ctx)
		if err != nil || info.Protocol != agent.ProtocolVersion {
			t.Fatalf("ping: %+v %v", info, err)
		}
		job, err := c.Start(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "uname -r; id -u; pwd"}})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		st, err := c.Attach(ctx, job, 0, 0, func(ch agent.Chunk) error { out.Write(ch.Data); return nil })
		if err != nil || st.ExitCode != 0 {
			t.Fatalf("attach: %+v %v", st, err)
		}
		if want := g.Release + "\n1000\n/workspace\n"; out.String() != want {
			t.Fatalf("agent exec: %q, want %q", out.String(), want)
		}
		// Concurrent requests share the channel.
		errs := make(chan error, 4)
		for range 4 {
			go func() { _, err := c.Ping(ctx); errs <- err }()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatalf("concurrent ping: %v", err)
			}
		}
	})

	t.Run("stdin", func(t *testing.T) {
		c, _ := v.QGA(ctxT(t, time.Minute))
		res, err := c.Exec(ctxT(t, time.Minute), qga.ExecRequest{Path: "/usr/bin/wc", Args: []string{"-c"}, Stdin: []byte("12345")})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "5" {
			t.Fatalf("wc -c: %v %+v", err, res)
		}
	})

	t.Run("file 1MiB", func(t *testing.T) {
		data := make([]byte, 1<<20)
		rand.Read(data)
		ctx := ctxT(t, time.Minute)
		c, _ := v.QGA(ctx)
		if n, err := c.WriteFile(ctx, "/workspace/blob", bytes.NewReader(data)); err != nil || n != int64(len(data)) {
			t.Fatalf("write: %d %v", n, err)
		}
		got, err := c.ReadFile(ctx, "/workspace/blob", 2<<20)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes, %v", len(got), err)
		}
		if res := sh(t, v, "stat -c %s /workspace/blob"); strings.TrimSpace(string(res.Stdout)) != "1048576" {
			t.Fatalf("guest sees %q", res.Stdout)
		}
		var qe *qga.Error
		if _, err := c.ReadFile(ctx, "/nonexistent", 10); !errorsAs(err, &qe) {
			t.Fatalf("missing file: %v", err)
		}
	})

	t.Run("qemu-ga output cap", func(t *testing.T) {
		// qemu-ga 7.2 keeps 16 MiB per stream and says it dropped the rest.
		t0 := time.Now()
		res := sh(t, v, "head -c 17000000 /dev/zero; echo done >&2")
		if !res.StdoutTruncated || len(res.Stdout) != 16<<20 || res.StderrTruncated || string(res.Stderr) != "done\n" {
			t.Fatalf("17 MB of output: %d bytes, truncated %v/%v, stderr %q", len(res.Stdout), res.StdoutTruncated, res.StderrTruncated, res.Stderr)
		}
		t.Logf("17 MB through guest-exec: %v", time.Since(t0))
	})

	t.Run("snapshot restore", func(t *testing.T) {
		ctx := ctxT(t, 2*time.Minute)
		if err := v.Snapshot(ctx, "clean"); err != nil {
			t.Fatal(err)
		}
		sh(t, v, "echo x > /workspace/after-snapshot")
		if res := sh(t, v, "test -e /workspace/after-snapshot"); res.ExitCode != 0 {
			t.Fatal("file not written")
		}
		if err := v.Restore(ctx, "clean"); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, v, "test -e /workspace/after-snapshot"); res.ExitCode != 1 {
			t.Fatalf("file still there after restore (exit %d)", res.ExitCode)
		}
		// The agent channel's session is from the future of the restored
		// guest: it must be replaced, not reused.
		if _, err := agent.NewClient(v.DialAgent).Ping(ctx); err != nil {
			t.Fatalf("agent after restore: %v", err)
		}
		names, err := v.Snapshots(ctx)
		if err != nil || len(names) != 1 || names[0] != "clean" {
			t.Fatalf("snapshots = %v, %v", names, err)
		}
		if err := v.Snapshot(ctx, "a/b"); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "name") {
			t.Fatalf("name with '/': %v", err)
		}
		if err := v.Restore(ctx, "nope"); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("unknown snapshot: %v", err)
		}
		if err := v.DeleteSnapshot(ctx, "clean"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("screenshot", func(t *testing.T) {
		b, err := v.Screenshot(ctxT(t, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if r := img.Bounds(); r.Dx() < 320 || r.Dy() < 200 {
			t.Fatalf("screen %v", r)
		}
		// QEMU (as nobody) got the file as a descriptor: the state dir
		// stays root's alone.
		if st, err := os.Stat(v.Dir()); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("state dir mode %v %v", st.Mode(), err)
		}
	})

	t.Run("confinement", func(t *testing.T) {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", v.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(status, []byte("\nSeccomp:\t2")) {
			t.Error("qemu runs without a seccomp filter")
		}
		uid := fieldOf(string(status), "Uid:")
		if uid == "0" || uid == "" {
			t.Errorf("qemu runs as uid %q, want nobody", uid)
		}
		procs, err := cgroups.Procs(s.Cgroup)
		if err != nil || !containsInt(procs, v.PID()) {
			t.Fatalf("qemu pid %d not in cgroup %s: %v %v", v.PID(), s.Cgroup, procs, err)
		}
		want := int64(256+256) << 20
		if got := memoryLimit(t, s.Cgroup); got != want {
			t.Errorf("memory limit %d, want %d", got, want)
		}
	})

	t.Run("adopt", func(t *testing.T) {
		// What a restarted daemon does: re-attach from the state dir.
		v.Close()
		a, err := vm.Adopt(ctxT(t, 30*time.Second), v.Dir())
		if err != nil {
			t.Fatal(err)
		}
		if a.PID() != v.PID() {
			t.Fatalf("adopted pid %d, want %d", a.PID(), v.PID())
		}
		if res := sh(t, a, "echo adopted"); string(res.Stdout) != "adopted\n" {
			t.Fatalf("exec through adopted VM: %q", res.Stdout)
		}
		if _, err := agent.NewClient(a.DialAgent).Ping(ctxT(t, 30*time.Second)); err != nil {
			t.Fatalf("agent through adopted VM: %v", err)
		}
		dir, pid := v.Dir(), v.PID()
		if err := a.Destroy(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("adopted VM's Done not closed after destroy")
		}
		assertGone(t, dir, pid, s.Cgroup)
		// Adopting what is gone is not_found.
		if _, err := vm.Adopt(ctxT(t, 5*time.Second), dir); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("adopt destroyed VM: %v", err)
		}
	})
}

func errorsAs(err error, target **qga.Error) bool {
	for e := err; e != nil; {
		if q, ok := e.(*qga.Error); ok {
			*target = q
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func fieldOf(status, key string) string {
	for _, l := range strings.Split(status, "\n") {
		if strings.HasPrefix(l, key) {
			if f := strings.Fields(l); len(f) > 1 {
				return f[1]
			}
		}
	}
	return ""
}

func containsInt(list []int, x int) bool {
	for _, y := range list {
		if y == x {
			return true
		}
	}
	return false
}

// memoryLimit reads the cgroup's memory limit on v1 (hybrid) or v2.
func memoryLimit(t *testing.T, cg string) int64 {
	t.Helper()
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"),
		filepath.Join("/sys/fs/cgroup", cg, "memory.max"),
	} {
		if b, err := os.ReadFile(f); err == nil {
			n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			return n
		}
	}
	t.Fatalf("no memory limit file for cgroup %s", cg)
	return 0
}

// assertGone checks that a destroyed VM left no QEMU process, socket,
// overlay or cgroup.
func assertGone(t *testing.T, dir string, pid int, cg string) {
	t.Helper()
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, []byte("qemu")) {
		t.Errorf("qemu pid %d still running", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s still there (sockets, overlay): %v", dir, err)
	}
	if cg != "" && cgroups.Exists(cg) {
		t.Errorf("cgroup %s still there", cg)
	}
}

// TestFastStart saves a template from a booted guest and starts a VM from
// it. SANDBOXD_VM_BOOTS=n (default 1) repeats cold boots and fast starts n
// times each and logs the medians (docs/vm.md "Figures" has them).
func TestFastStart(t *testing.T) {
	testenv.RequireRoot(t)
	g := vmenv.Guest(t)
	n := 1
	if s := os.Getenv("SANDBOXD_VM_BOOTS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	var cold, fast []time.Duration
	var tmpl string
	for i := range n {
		s := newSpec(t, g)
		v, d := start(t, s)
		cold = append(cold, d)
		if i == 0 {
			sh(t, v, "echo from-template > /workspace/marker && sync")
			tmpl = filepath.Join(t.TempDir(), "template.qcow2")
			if err := v.SaveTemplate(ctxT(t, time.Minute), tmpl); err != nil {
				t.Fatal(err)
			}
			assertGone(t, s.Dir, v.PID(), s.Cgroup)
		} else if err := v.Destroy(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		s := newSpec(t, g)
		s.FromTemplate = tmpl
		v, d := start(t, s)
		fast = append(fast, d)
		if res := sh(t, v, "cat /workspace/marker; uname -r"); string(res.Stdout) != "from-template\n"+g.Release+"\n" {
			t.Fatalf("VM from template: %q", res.Stdout)
		}
		// The template is shared: the VM writes to its own copy.
		sh(t, v, "echo mine > /workspace/marker && sync")
		// guest-shutdown through Debian's qemu-ga: the guest powers off and,
		// with -no-reboot, QEMU exits.
		c, err := v.QGA(ctxT(t, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Shutdown(ctxT(t, time.Minute), "powerdown"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-v.Done():
		case <-time.After(time.Minute):
			t.Fatalf("qemu still running a minute after guest-shutdown; console: %s", v.Console(1000))
		}
		dir, pid := v.Dir(), v.PID()
		if err := v.Destroy(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
		assertGone(t, dir, pid, s.Cgroup)
	}
	t.Logf("cold boot to ready agent: median %v of %v", median(cold), cold)
	t.Logf("start from snapshot to ready agent: median %v of %v", median(fast), fast)
	if median(fast) >= median(cold) {
		t.Errorf("starting from the snapshot (%v) is not faster than booting (%v)", median(fast), median(cold))
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

// TestFirmwareTPM boots the Linux guest through OVMF (UEFI) with a swtpm
// TPM 2.0: the plumbing the Windows profile uses.
func TestFirmwareTPM(t *testing.T) {
	testenv.RequireRoot(t)
	g := vmenv.Guest(t)
	s := newSpec(t, g)
	s.Firmware = &vm.Firmware{Code: "/usr/share/OVMF/OVMF_CODE_4M.fd", Vars: "/usr/share/OVMF/OVMF_VARS_4M.fd"}
	s.TPM = true
	v, d := start(t, s)
	t.Logf("UEFI boot with TPM to ready agent: %v", d)
	res := sh(t, v, "test -d /sys/firmware/efi && echo efi; test -c /dev/tpm0 && echo tpm0; cat /sys/class/tpm/tpm0/tpm_version_major")
	if got := string(res.Stdout); got != "efi\ntpm0\n2\n" {
		t.Fatalf("guest sees %q (stderr %q), want efi, tpm0, TPM version 2", got, res.Stderr)
	}
	// Snapshots work with UEFI: the variable store is qcow2, not raw.
	if err := v.Snapshot(ctxT(t, time.Minute), "uefi"); err != nil {
		t.Fatal(err)
	}
	dir, pid := v.Dir(), v.PID()
	if err := v.Destroy(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir, pid, s.Cgroup)
	if out, _ := exec.Command("pgrep", "-f", "swtpm socket --tpm2 --tpmstate dir="+dir).Output(); len(out) > 0 {
		t.Fatalf("swtpm still running: %s", out)
	}
}
