//go:build cgroupv2

package cgroupv2

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// guestTests are the pkg/engine tests run in the guest: those that go
// through the cgroup code of the sandbox core (limits written by
// libcontainer, usage and OOM kills read by pkg/cgroups, per-job cgroups
// and cgroup.kill in the agent, the freezer, io.max, adoption after a
// restart), within the time a
// 2-core TCG guest allows. TestCgroupLimitFiles shows memory.max, cpu.max
// and pids.max.
var guestTests = "^(" + strings.Join([]string{
	"TestCgroupLimitFiles",
	"TestCgroupAdoptedAfterRestart",
	"TestLifecycle",
	"TestIsolation",
	"TestMemoryBombOOM",
	"TestForkBombHeldByPidsLimit",
	"TestPidsLimitSparesTheAgent",
	"TestTimeoutKillsProcessGroup",
	"TestTimeoutKillsEscapedProcesses",
	"TestCPUQuota",
	"TestPauseResume",
	"TestIOThrottle",
}, "|") + ")$"

// unifiedOnly is the kernel command line that leaves cgroup v1 unmounted:
// no v1 controller can be mounted, and the guest's init mounts cgroup2 at
// /sys/fs/cgroup (rootfs/vm/files/vm-linux/sandbox-init).
const unifiedOnly = "systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"

// TestSandboxCoreOnCgroupV2 boots the Linux test guest with only the
// unified hierarchy and runs pkg/cgroups' TestParentLifecycle and
// pkg/engine's guestTests there from a second disk.
func TestSandboxCoreOnCgroupV2(t *testing.T) {
	testenv.RequireRoot(t)
	start := time.Now()
	// The guest's failed tests, each with its own output, logged last (the
	// first cleanup registered runs last): CI shows the tail of a failed
	// run, and the whole guest output is far longer than that tail.
	var guestFailures string
	t.Cleanup(func() {
		if guestFailures != "" {
			t.Logf("the guest's failed tests:\n%s", guestFailures)
		}
	})
	guest := vmenv.Guest(t)
	shell := testenv.EnsureImages(t, "shell")["shell"]

	// The data disk's tree, next to the image cache so that the image
	// can be hard-linked into it instead of copied.
	work, err := os.MkdirTemp(filepath.Dir(testenv.ImagesDir()), "sbx-cgv2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	stage := filepath.Join(work, "data")
	for _, d := range []string{"images/by-name", "repo", "apt"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, pkg := range []string{"engine", "cgroups"} {
		run(t, testenv.RepoRoot, []string{"CGO_ENABLED=1"}, "go", "test", "-c", "-tags", "seccomp",
			"-o", filepath.Join(stage, pkg+".test"), "./pkg/"+pkg)
	}
	run(t, "", nil, "cp", testenv.AgentPath(t), filepath.Join(stage, "sandbox-agent"))
	// The containers' `runc init`, found beside the agent.
	run(t, "", nil, "cp", filepath.Join(filepath.Dir(testenv.AgentPath(t)), "sandbox-init"), filepath.Join(stage, "sandbox-init"))
	run(t, "", nil, "cp", filepath.Join(testenv.RepoRoot, "test/cgroupv2/guest-run.sh"), filepath.Join(stage, "run.sh"))
	imgDir := filepath.Dir(shell.Rootfs)
	if err := exec.Command("cp", "-al", imgDir, filepath.Join(stage, "images")).Run(); err != nil {
		run(t, "", nil, "cp", "-a", imgDir, filepath.Join(stage, "images"))
	}
	if err := os.Symlink(filepath.Join("..", shell.Digest), filepath.Join(stage, "images/by-name/shell")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"rootfs", "seccomp-profiles"} {
		run(t, "", nil, "cp", "-a", filepath.Join(testenv.RepoRoot, d), filepath.Join(stage, "repo", d))
	}
	for _, f := range []string{"/etc/apt/sources.list", "/etc/apt/sources.list.d"} {
		if _, err := os.Stat(f); err == nil {
			run(t, "", nil, "cp", "-a", f, filepath.Join(stage, "apt"))
		}
	}
	// mkfs.ext4 -d copies the tree into a new file system: no loop
	// device, no mount. The free space takes the sandboxes' disks (sparse
	// files under TMPDIR in the guest).
	used := duBytes(t, stage)
	size := (used + used/5 + 2<<30 + (1<<20 - 1)) &^ (1<<20 - 1)
	disk := filepath.Join(work, "data.raw")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "", nil, "mkfs.ext4", "-q", "-F", "-L", "cgv2-data", "-d", stage, "-E", "root_owner=0:0", disk, fmt.Sprintf("%dk", size>>10))
	if err := os.RemoveAll(stage); err != nil {
		t.Fatal(err)
	}
	t.Logf("data disk: %d MiB of files in a %d MiB file system (%.1fs so far)", used>>20, size>>20, time.Since(start).Seconds())

	base, err := os.MkdirTemp("/run", "cgv2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	parent := "/mcp-sandboxd-cgv2-" + testenv.RandHex(4)
	t.Cleanup(func() { testenv.RemoveCgroupParent(t, parent) })
	id := "cgv2-" + testenv.RandHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	v, err := vm.Start(ctx, vm.Spec{
		ID: id, Dir: filepath.Join(base, id), Guest: guest,
		// Sandboxes of up to 256 MiB each, the test binary and the
		// guest's tmpfs (/run holds the sandboxes' run dirs).
		MemoryMiB: 2560, CPUs: 2,
		Cgroup: parent + "/" + id, RunAs: "nobody",
		KernelArgs: unifiedOnly, DataDisks: []string{disk},
	})
	if err != nil {
		t.Fatalf("start guest: %v", err)
	}
	var guestOutput string
	t.Cleanup(func() {
		if t.Failed() && guestOutput == "" { // the console repeats the guest output
			t.Logf("guest console (tail):\n%s", v.Console(8000))
		}
		if err := v.Destroy(context.Background()); err != nil {
			t.Errorf("destroy guest: %v", err)
		}
		// Nothing of the guest is left: QEMU, its directory (sockets,
		// overlay), its cgroup.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", v.PID())); err == nil {
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", v.PID())); strings.Contains(string(st), id) {
				t.Errorf("qemu pid %d still runs after destroy", v.PID())
			}
		}
		if _, err := os.Stat(v.Dir()); !os.IsNotExist(err) {
			t.Errorf("guest directory %s left after destroy: %v", v.Dir(), err)
		}
		if d := testenv.CgroupDirs(parent + "/" + id); len(d) > 0 {
			t.Errorf("guest cgroup left after destroy: %v", d)
		}
	})
	if err := v.WaitReady(ctx); err != nil {
		t.Fatalf("guest not ready: %v", err)
	}
	t.Logf("guest %s ready under %s (%.1fs so far)", guest.Release, v.Accel(), time.Since(start).Seconds())
	c, err := v.QGA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sh := func(cmd string) *qga.ExecResult {
		t.Helper()
		// (2>&1, not Merged: Debian 12's qemu-ga 7.2 takes only a boolean
		// capture-output.)
		res, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c", cmd + " 2>&1"}})
		if err != nil {
			t.Fatalf("guest %q: %v", cmd, err)
		}
		return res
	}
	if res := sh("mkdir -p /mnt/data && mount -t ext4 /dev/vdb /mnt/data"); res.ExitCode != 0 {
		t.Fatalf("mount the data disk: %s", res.Stdout)
	}
	tests := guestTests
	if r := os.Getenv("SANDBOXD_CGROUPV2_RUN"); r != "" {
		tests = "^(" + r + ")$" // a subset while working on one test
	}
	t0 := time.Now()
	// The output also goes to the serial console (console.log), for a run
	// that hangs.
	res, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/bash", Args: []string{"-c",
		`set -o pipefail; /bin/bash /mnt/data/run.sh "$0" "$1" 2>&1 | tee /dev/ttyS0`, testenv.RepoRoot, tests}})
	if err != nil {
		t.Fatalf("run the tests in the guest: %v", err)
	}
	out := string(res.Stdout) + string(res.Stderr)
	guestOutput = out
	t.Logf("guest output (%.0fs):\n%s", time.Since(t0).Seconds(), out)
	if res.ExitCode != 0 || res.Signaled || !strings.Contains(out, "== guest tests passed") {
		guestFailures = failedTestOutput(out)
		t.Fatalf("the sandbox core's tests failed on cgroup v2 (exit %d, signal %d)", res.ExitCode, res.Signal)
	}
	// Every selected test ran and passed (a pattern that matched nothing
	// would pass too).
	for _, name := range append(strings.Split(strings.Trim(tests, "^()$"), "|"), "TestParentLifecycle") {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + name + ` `).MatchString(out) {
			t.Errorf("%s did not pass in the guest", name)
		}
	}
	// The limits as the v2 files hold them, read in the guest by
	// TestCgroupLimitFiles: 96 MiB, half a CPU, 48 pids for the commands
	// and agent.PidsReserve more for the sandbox.
	for _, want := range []string{
		"cgroup mode v2",
		"cgroup file memory.max = 100663296",
		"cgroup file cpu.max = 50000 100000",
		"cgroup file pids.max = 80",
		"cgroup file jobs/pids.max = 48",
		"cgroup file cgroup.freeze = 1",
		"cgroup file cgroup.freeze = 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	t.Logf("make test-cgroupv2: %.0fs in total", time.Since(start).Seconds())
}

// failedTestOutput returns, for each top-level test that failed in a go
// test -v output, the lines from its "=== RUN" to its "--- FAIL" (the
// whole tail when a test did not end: a panic or a timeout).
func failedTestOutput(out string) string {
	var b strings.Builder
	lines := strings.Split(out, "\n")
	begin := -1
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "=== RUN   ") && !strings.Contains(l, "/"):
			begin = i
		case strings.HasPrefix(l, "--- FAIL: ") && begin >= 0:
			b.WriteString(strings.Join(lines[begin:i+1], "\n") + "\n")
			begin = -1
		case strings.HasPrefix(l, "--- PASS: "):
			begin = -1
		}
	}
	if begin >= 0 { // a test that never ended
		b.WriteString(strings.Join(lines[begin:], "\n"))
	}
	return b.String()
}

// run runs a command and fails t with its output if it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// duBytes is the space the files under dir take (hard links once).
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "-B1", dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	var n int64
	if _, err := fmt.Sscan(string(out), &n); err != nil {
		t.Fatalf("du %s: %q", dir, out)
	}
	return n
}

func TestFailedTestOutput(t *testing.T) {
	out := "=== RUN   TestA\n--- PASS: TestA (0.1s)\n=== RUN   TestB\n=== RUN   TestB/x\n    b_test.go:9: boom\n    --- FAIL: TestB/x (0.0s)\n--- FAIL: TestB (0.2s)\n=== RUN   TestC\npanic: oops\n"
	want := "=== RUN   TestB\n=== RUN   TestB/x\n    b_test.go:9: boom\n    --- FAIL: TestB/x (0.0s)\n--- FAIL: TestB (0.2s)\n=== RUN   TestC\npanic: oops\n"
	if got := failedTestOutput(out); got != want {
		t.Errorf("failedTestOutput = %q, want %q", got, want)
	}
}
