package engine

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// TestCgroupLimitFiles reads a sandbox's limits back from the kernel's
// cgroup files — memory.max, cpu.max, pids.max on cgroup v2; their v1
// counterparts on v1 and hybrid hosts — checks that a job runs in its own
// child cgroup, and that pause freezes the sandbox's cgroup. Each file is
// logged as "cgroup file <name> = <value>" (make test-cgroupv2 shows them).
//
// With SANDBOXD_CGROUPV2=1 (set by make test-cgroupv2 inside its guest) the
// host must be unified: cgroup2 at /sys/fs/cgroup and no v1 hierarchy, so
// that the v2 code paths, not the hybrid ones, are what passed.
func TestCgroupLimitFiles(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	mode := cgroups.HostMode()
	t.Logf("cgroup mode %s", mode)
	if os.Getenv("SANDBOXD_CGROUPV2") == "1" {
		if mode != cgroups.ModeUnified {
			t.Fatalf("SANDBOXD_CGROUPV2=1 but the cgroup mode is %s", mode)
		}
		mounts, err := os.ReadFile("/proc/self/mounts")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup" {
				t.Errorf("a cgroup v1 hierarchy is mounted: %s", line)
			}
		}
	}

	const memMB, cpus, pids = 96, 0.5, 48
	info := env.create(t, CreateSandboxRequest{MemoryMB: ptr[int64](memMB), CPUs: ptr(cpus), Pids: ptr[int64](pids)})
	read := func(hierarchy, file string) string {
		t.Helper()
		dir := filepath.Join(cgroups.Root, info.CgroupPath)
		if mode != cgroups.ModeUnified {
			dir = filepath.Join(cgroups.Root, hierarchy, info.CgroupPath)
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Errorf("read %s: %v", file, err)
			return ""
		}
		v := strings.TrimSpace(string(b))
		t.Logf("cgroup file %s = %s", file, v)
		return v
	}
	if mode == cgroups.ModeUnified {
		want := map[string]string{
			"memory.max": "100663296", // 96 MiB
			"cpu.max":    "50000 100000",
			// The commands' 48 and the agent's reserve (agent.PidsReserve);
			// jobs/, the cgroup all the jobs share, has the commands' 48.
			"pids.max":      "80",
			"jobs/pids.max": "48",
			// memory+swap = memory (pkg/runtime): no swap at all.
			"memory.swap.max": "0",
		}
		for file, w := range want {
			if _, err := os.Stat(filepath.Join(cgroups.Root, info.CgroupPath, file)); os.IsNotExist(err) && file == "memory.swap.max" {
				continue // kernel without swap accounting
			}
			if got := read("", file); got != w {
				t.Errorf("%s = %q, want %q", file, got, w)
			}
		}
	} else {
		for _, c := range []struct{ hierarchy, file, want string }{
			{"memory", "memory.limit_in_bytes", "100663296"},
			{"cpu", "cpu.cfs_quota_us", "50000"},
			{"cpu", "cpu.cfs_period_us", "100000"},
			{"pids", "pids.max", "80"},
			{"pids", "jobs/pids.max", "48"},
		} {
			if got := read(c.hierarchy, c.file); got != c.want {
				t.Errorf("%s/%s = %q, want %q", c.hierarchy, c.file, got, c.want)
			}
		}
	}

	// A job runs in its own child cgroup (the agent's per-job cgroups);
	// inside the sandbox's cgroup namespace it is /j-<id>, or on v2, where
	// it is a child of the cgroup all jobs share, /jobs/j-<id>.
	res := env.sh(t, info.ID, "cat /proc/self/cgroup")
	t.Logf("/proc/self/cgroup of a job:\n%s", res.Stdout)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	// On a v1-only host the kernel still lists its (unmounted, unused) v2
	// hierarchy as "0::/"; the job's cgroups are then its freezer's and
	// cpuacct's.
	jobLine := regexp.MustCompile(`^0::/j-[0-9a-f]+$`)
	prefix := "0::"
	if mode == cgroups.ModeUnified {
		jobLine = regexp.MustCompile(`^0::/jobs/j-[0-9a-f]+$`)
	}
	if mode == cgroups.ModeLegacy {
		jobLine = regexp.MustCompile(`^[0-9]+:freezer:/j-[0-9a-f]+$`)
		prefix = ""
	}
	var jobCgroup string
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) && (prefix != "" || strings.Contains(l, ":freezer:")) {
			jobCgroup = l
		}
	}
	if !jobLine.MatchString(jobCgroup) {
		t.Errorf("job's cgroup line = %q, want %s", jobCgroup, jobLine)
	}
	if mode != cgroups.ModeUnified && !regexp.MustCompile(`(?m)^[0-9]+:pids:/jobs$`).MatchString(res.Stdout) {
		t.Errorf("a job's v1 pids cgroup is not /jobs: %q", res.Stdout)
	}
	if mode == cgroups.ModeUnified {
		if len(lines) != 1 {
			t.Errorf("/proc/self/cgroup on a unified host has %d lines: %q", len(lines), res.Stdout)
		}
		// The agent moved itself into a leaf so that the memory
		// controller could be enabled for the jobs' cgroups.
		if got := strings.Fields(read("", "cgroup.subtree_control")); !slices.Contains(got, "memory") || !slices.Contains(got, "pids") {
			t.Errorf("sandbox cgroup.subtree_control = %q, want memory and pids enabled for the jobs", got)
		}
		if got := read("", "jobs/cgroup.subtree_control"); got != "memory" {
			t.Errorf("jobs/cgroup.subtree_control = %q, want memory enabled for each job", got)
		}
		// The agent alone, once the next spare job helper, started as the
		// job was, has moved on to its own cgroup: it is forked into the
		// agent's (clone3's CLONE_INTO_CGROUP is refused by the seccomp
		// profile) and the move takes a while on a slow (TCG) guest.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got := read("", "agent/cgroup.procs")
			if len(strings.Fields(got)) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("agent/cgroup.procs = %q, want the agent alone", got)
				break
			}
		}
	}

	// The job's own cgroup accounts its memory: a command filling a 30 MiB
	// buffer reports a peak of at least 20 MiB (memory.peak of the job's
	// cgroup on v2, memory.max_usage_in_bytes on v1).
	res = env.sh(t, info.ID, "dd if=/dev/zero of=/dev/null bs=30M count=1 2>&1")
	if res.Usage == nil || res.Usage.MemoryPeakBytes < 20<<20 {
		t.Errorf("memory peak of a job filling 30 MiB = %+v (%s), want at least 20 MiB", res.Usage, res.Stdout)
	} else {
		t.Logf("job usage: %.2f CPU-seconds, memory peak %d bytes", res.Usage.CPUSeconds, res.Usage.MemoryPeakBytes)
	}

	// Pause freezes the whole cgroup; resume thaws it.
	frozen := func() string {
		t.Helper()
		if mode == cgroups.ModeUnified {
			return read("", "cgroup.freeze")
		}
		return read("freezer", "freezer.state")
	}
	if _, err := env.PauseSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if got := frozen(); got != "1" && got != "FROZEN" {
		t.Errorf("paused sandbox's freezer = %q", got)
	}
	if mode == cgroups.ModeUnified {
		// cgroup.freeze is the request; cgroup.events says it is done.
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(read("", "cgroup.events"), "frozen 1") {
			if time.Now().After(deadline) {
				t.Fatal("cgroup.events never reported frozen 1")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if r, err := env.ResumeSandbox(ctx, info.ID); err != nil || r.State != sandbox.StateReady {
		t.Fatalf("resume: %v %+v", err, r)
	}
	if got := frozen(); got != "0" && got != "THAWED" {
		t.Errorf("resumed sandbox's freezer = %q", got)
	}
	if res := env.sh(t, info.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("after resume: %+v", res)
	}
}

// TestCgroupAdoptedAfterRestart: a restarted engine adopts a sandbox with
// a job running in its per-job cgroup: the limits are still in the
// sandbox's cgroup, usage is read from it, and a kill through the new
// engine empties the job's cgroup, an escaped (setsid) process included.
func TestCgroupAdoptedAfterRestart(t *testing.T) {
	testenv.EnsureImages(t, "shell")
	cfg := testenv.Config(t, "cgrs")
	ctx := context.Background()
	e1, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	info, err := e1.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", MemoryMB: ptr[int64](96), Pids: ptr[int64](48)})
	if err != nil {
		t.Fatal(err)
	}
	job, err := e1.StartJob(ctx, ExecRequest{SandboxID: info.ID, Command: "setsid sleep 1011 & sleep 1013"})
	if err != nil {
		t.Fatal(err)
	}
	e1.sandboxes.Close()
	if err := e1.Close(); err != nil { // the sandbox and its job stay
		t.Fatal(err)
	}

	e2, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	env := watchEngine(t, e2, cfg)
	limit := filepath.Join(cgroups.Root, info.CgroupPath, "memory.max")
	if cgroups.HostMode() != cgroups.ModeUnified {
		limit = filepath.Join(cgroups.Root, "memory", info.CgroupPath, "memory.limit_in_bytes")
	}
	if b, err := os.ReadFile(limit); err != nil || strings.TrimSpace(string(b)) != "100663296" {
		t.Errorf("%s of the adopted sandbox = %q, %v", limit, b, err)
	}
	d, err := e2.GetSandbox(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The agent and the job's shell and two sleeps.
	if d.Usage == nil || d.Usage.Pids < 4 {
		t.Errorf("usage of the adopted sandbox = %+v, want the agent and the job's 3 processes", d.Usage)
	}
	if procs, err := cgroups.Procs(info.CgroupPath); err != nil || len(procs) < 4 {
		t.Errorf("processes of the adopted sandbox = %v, %v", procs, err)
	}
	if len(hostProcsOf(t, info.ID, "sleep")) != 2 {
		t.Fatalf("the job's sleeps before the kill: %v", hostProcsOf(t, info.ID, "sleep"))
	}
	if _, err := e2.KillJob(ctx, apitypes.JobKillRequest{SandboxID: info.ID, JobID: job}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(hostProcsOf(t, info.ID, "sleep")) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("processes of the killed job survive: %v", hostProcsOf(t, info.ID, "sleep"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res := env.sh(t, info.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("adopted sandbox after the kill: %+v", res)
	}
}
