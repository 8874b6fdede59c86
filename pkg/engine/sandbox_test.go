package engine

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

func ptr[T any](v T) *T { return &v }

func (env *testEnv) create(t *testing.T, req CreateSandboxRequest) *sandbox.Info {
	t.Helper()
	if req.Language == "" && req.Image == "" {
		req.Language = "shell"
	}
	info, err := env.CreateSandbox(context.Background(), req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	return info
}

func (env *testEnv) sh(t *testing.T, id, script string, timeout ...float64) *sandbox.ExecResult {
	t.Helper()
	req := ExecRequest{SandboxID: id, Command: script}
	if len(timeout) > 0 {
		req.TimeoutSeconds = &timeout[0]
	}
	res, err := env.Exec(context.Background(), req, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

func TestLifecycle(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	if info.State != sandbox.StateReady {
		t.Fatalf("state after create = %s, want ready", info.State)
	}
	res := env.sh(t, info.ID, "echo hi; exit 3")
	if res.Stdout != "hi\n" || res.ExitCode != 3 || res.Termination.Cause != sandbox.CauseExited {
		t.Fatalf("exec = stdout %q exit %d cause %s, want \"hi\\n\" 3 exited", res.Stdout, res.ExitCode, res.Termination.Cause)
	}
	if res.Termination.ExitCode == nil || *res.Termination.ExitCode != 3 {
		t.Errorf("termination.exit_code = %v, want 3", res.Termination.ExitCode)
	}
	res = env.sh(t, info.ID, "echo out; echo err >&2")
	if res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Errorf("streams = %q / %q", res.Stdout, res.Stderr)
	}
	sbDir := filepath.Join(env.cfg.Paths.RunDir, "sandboxes", info.ID)
	if _, err := os.Stat(sbDir); err != nil {
		t.Fatalf("sandbox dir missing while live: %v", err)
	}
	if !cgroups.Exists(info.CgroupPath) {
		t.Fatalf("cgroup %s missing while live", info.CgroupPath)
	}
	got, err := env.GetSandbox(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Usage == nil || got.Usage.MemoryBytes == 0 || got.Usage.Pids == 0 {
		t.Errorf("usage not reported: %+v", got.Usage)
	}

	term, err := env.TerminateSandbox(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if term.State != sandbox.StateTerminated || term.TerminatedAt == nil {
		t.Fatalf("after terminate: %+v", term)
	}
	if cgroups.Exists(info.CgroupPath) {
		t.Errorf("cgroup %s left behind", info.CgroupPath)
	}
	if _, err := os.Stat(sbDir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir left behind: %v", err)
	}
	if m := mountsUnder(env.cfg.Paths.RunDir); len(m) > 0 {
		t.Errorf("mounts left behind: %v", m)
	}
	if _, err := os.Stat(filepath.Join(env.cfg.Paths.RunDir, "runtime", info.ID)); !os.IsNotExist(err) {
		t.Errorf("libcontainer state left behind: %v", err)
	}
	// Terminate is idempotent.
	if again, err := env.TerminateSandbox(ctx, info.ID); err != nil || again.State != sandbox.StateTerminated {
		t.Errorf("second terminate = %v, %v", again, err)
	}

	// The state machine's path is persisted as events.
	evs, err := env.store.Events(ctx, info.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, e := range evs {
		path = append(path, e.To)
	}
	want := "creating ready running ready running ready terminated"
	if strings.Join(path, " ") != want {
		t.Errorf("events = %v, want %s", path, want)
	}
}

// TestNormalModeCapabilities runs what needs each of the agent's
// capabilities (runtime.AgentCapabilities) with and without a user
// namespace (without one they are host capabilities): commands as the
// sandbox user (SETUID, SETGID, and SETPCAP for their empty bounding set),
// file operations with the user's credentials (SETUID, SETGID), a signal
// other than SIGKILL to a job of another uid (KILL: it is delivered with
// kill(2), not through the job's cgroup), a timeout, a working directory
// only the user may enter (entered as the user, without DAC_OVERRIDE).
func TestNormalModeCapabilities(t *testing.T) {
	for _, c := range []struct {
		name   string
		userns bool
	}{{"userns", true}, {"no userns", false}} {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEngine(t, func(cfg *config.Config) {
				if !c.userns {
					cfg.Sandbox.UsernsPool.Count = 0
				}
			})
			ctx := context.Background()
			id := env.create(t, CreateSandboxRequest{}).ID
			caps := "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/%s/status | tr -s '\\t' ' ' | tr '\\n' ' '"
			if got := strings.TrimSpace(env.sh(t, id, fmt.Sprintf(caps, "1")).Stdout); got != "CapInh: 0000000000000000 CapPrm: 00000000000001e0 CapEff: 00000000000001e0 CapBnd: 00000000000001e0 CapAmb: 0000000000000000 NoNewPrivs: 1" {
				t.Errorf("agent: %q, want KILL, SETGID, SETUID, SETPCAP (0x1e0)", got)
			}
			if got := strings.TrimSpace(env.sh(t, id, fmt.Sprintf(caps, "self")).Stdout); got != "CapInh: 0000000000000000 CapPrm: 0000000000000000 CapEff: 0000000000000000 CapBnd: 0000000000000000 CapAmb: 0000000000000000 NoNewPrivs: 1" {
				t.Errorf("command: %q, want no capability in any set", got)
			}
			if got := strings.TrimSpace(env.sh(t, id, "id -u; cat /proc/self/oom_score_adj").Stdout); got != "1000\n500" {
				t.Errorf("command: uid and oom_score_adj %q, want 1000 and 500", got)
			}

			// The file API as the user: its files are the user's, a
			// directory it made private stays reachable for it.
			if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: id, Path: "/workspace/priv/f", Content: "secret"}); err != nil {
				t.Fatal(err)
			}
			env.sh(t, id, "chmod 700 /workspace/priv")
			if rd, err := env.ReadFile(ctx, FileReadRequest{SandboxID: id, Path: "/workspace/priv/f"}); err != nil || rd.Content != "secret" {
				t.Errorf("read back: %+v, %v", rd, err)
			}
			if got := strings.TrimSpace(env.sh(t, id, "stat -c '%u %a' /workspace/priv/f").Stdout); got != "1000 644" {
				t.Errorf("written file: owner and mode %q, want 1000 644", got)
			}
			// A working directory only the user may enter.
			res, err := env.Exec(ctx, ExecRequest{SandboxID: id, Command: "pwd", Cwd: "/workspace/priv"}, nil)
			if err != nil || strings.TrimSpace(res.Stdout) != "/workspace/priv" {
				t.Errorf("cwd in a 0700 directory of the user: %+v, %v", res, err)
			}

			// SIGTERM to a job of another uid.
			job, err := env.StartJob(ctx, ExecRequest{SandboxID: id, Command: "exec sleep 60"})
			if err != nil {
				t.Fatal(err)
			}
			if kr, err := env.KillJob(ctx, apitypes.JobKillRequest{SandboxID: id, JobID: job, Signal: "SIGTERM"}); err != nil || kr.State != "finished" {
				t.Errorf("SIGTERM: %+v, %v; want the job finished", kr, err)
			}
			st, err := env.JobStatus(ctx, JobStatusRequest{SandboxID: id, JobID: job})
			if err != nil || st.Termination == nil || st.Termination.Signal != "SIGTERM" {
				t.Errorf("job after SIGTERM: %+v, %v; want ended by SIGTERM", st, err)
			}

			// A timeout empties the job, setsid children included.
			if res := env.sh(t, id, "(setsid sleep 1001 &); sleep 100", 1); res.Termination.Cause != "timeout" {
				t.Errorf("timeout: %+v", res.Termination)
			}
			if got := strings.TrimSpace(env.sh(t, id, "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true").Stdout); got != "0" {
				t.Errorf("sleeps left after the timeout: %s", got)
			}
		})
	}
}

func TestIsolation(t *testing.T) {
	env := newTestEngine(t)
	info := env.create(t, CreateSandboxRequest{})
	id := info.ID
	checks := []struct {
		name, script, want string
	}{
		{"uid", "id -u", "1000"},
		{"gid", "id -g", "1000"},
		// Real, effective, saved and file-system ids alike, and no
		// supplementary group but its own: the job-exec helper switches
		// them on the thread that execs (pkg/agent/server/jobexec.go).
		{"credentials", "grep -E '^(Uid|Gid|Groups):' /proc/self/status | tr -s '\\t' ' ' | tr '\\n' ' '", "Uid: 1000 1000 1000 1000 Gid: 1000 1000 1000 1000 Groups: 1000"},
		// A command has no capability in any set, not even in its bounding
		// set (the job-exec helper drops it: pkg/agent/server/jobexec.go).
		{"no capabilities", "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | tr -s '\\t' ' ' | tr '\\n' ' '", "CapInh: 0000000000000000 CapPrm: 0000000000000000 CapEff: 0000000000000000 CapBnd: 0000000000000000 CapAmb: 0000000000000000"},
		// The agent holds exactly runtime.AgentCapabilities — KILL (5),
		// SETGID (6), SETUID (7), SETPCAP (8) — as bounding, permitted and
		// effective set: 0x1e0.
		{"agent capabilities", "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' ' | tr '\\n' ' '", "CapInh: 0000000000000000 CapPrm: 00000000000001e0 CapEff: 00000000000001e0 CapBnd: 00000000000001e0 CapAmb: 0000000000000000 NoNewPrivs: 1"},
		{"no_new_privs", "grep NoNewPrivs /proc/self/status | cut -f2", "1"},
		{"seccomp filter", "grep '^Seccomp:' /proc/self/status | cut -f2", "2"},
		{"hostname is the id", "hostname", id},
		{"pid 1 is the agent", "tr '\\0' ' ' </proc/1/cmdline | cut -d' ' -f1", "/.sandboxd/agent"},
		// Exactly these processes are visible: the agent (1), this shell,
		// whose parent it is, and at most one spare job helper (another
		// "agent", waiting for the next command); shell builtins only, so
		// nothing else runs. (A glob sorts "1" before every other pid.)
		{"own pid namespace", `cd /proc && v= && a=0 && for d in [0-9]*; do n=; while read -r k x; do [ "$k" = Name: ] && n=$x; done <$d/status; if [ "$d" != 1 ] && [ "$n" = agent ]; then a=$((a+1)); else v="$v $d"; fi; done; while read -r k p; do [ "$k" = PPid: ] && pp=$p; done </proc/self/status; [ "$v" = " 1 $$" ] && [ "$pp" = 1 ] && [ $a -le 1 ] && echo exact || echo "visible:$v self $$ parent $pp spares $a"`, "exact"},
		{"root read-only", "touch /rootfile 2>&1 | grep -c 'Read-only file system'", "1"},
		{"usr read-only", "touch /usr/x 2>&1 | grep -c 'Read-only file system'", "1"},
		{"workspace writable", "echo a > /workspace/a && cat /workspace/a", "a"},
		{"tmp writable", "echo b > /tmp/b && cat /tmp/b", "b"},
		// mount(2) and keyctl(2) through perl's syscall (perl-base is
		// essential in Debian), so the checks do not depend on which tools
		// the image ships: the kernel's answer is what matters.
		{"mount denied", `perl -e 'my ($s, $d, $t) = ("none", "/tmp", "tmpfs"); $r = syscall(165, $s, $d, $t, 0, 0); print $r < 0 ? "denied:" . ($!+0) : "allowed"'`, "denied:1"},
		{"unshare -U denied", "unshare -U true 2>/dev/null; echo $?", "1"},
		// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING): seccomp refuses it.
		{"keyctl denied", `perl -e '$r = syscall(250, 0, -3, 0); print $r < 0 ? "denied:" . ($!+0) : "allowed"'`, "denied:1"},
		// Every hierarchy at the namespace's root but the job's own
		// cgroups (/j-<id>, on v2 /jobs/j-<id>) and the v1 pids cgroup
		// all jobs share (/jobs).
		{"cgroup namespace", "cat /proc/self/cgroup | grep -Ev ':/$|:/(jobs/)?j-[0-9a-f]+$|:pids:/jobs$' | wc -l", "0"},
		{"agent socket unreachable", "ls /.sandboxd/run 2>&1 | grep -c 'Permission denied'", "1"},
		{"loopback only", "ls /sys/class/net | tr '\\n' ' '", "lo"},
		{"host processes invisible", fmt.Sprintf("test -e /proc/%d && echo visible || echo hidden", os.Getpid()), "hidden"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res := env.sh(t, id, c.script)
			if got := strings.TrimSpace(res.Stdout); got != c.want {
				t.Errorf("%s: got %q (stderr %q, exit %d), want %q", c.script, got, res.Stderr, res.ExitCode, c.want)
			}
		})
	}

	// Seen from the host, the sandbox's cgroup holds one process at rest:
	// the agent, PID 1 in its own namespace under a host pid the sandbox
	// cannot see.
	t.Run("agent is pid 1 of its namespace", func(t *testing.T) {
		procs, err := agentProcs(info.CgroupPath)
		if err != nil || len(procs) != 1 {
			t.Fatalf("processes in %s at rest = %v, %v; want the agent alone (besides its spare job helper)", info.CgroupPath, procs, err)
		}
		host := procs[0]
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", host))
		if err != nil {
			t.Fatal(err)
		}
		var nspid []string
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
				nspid = strings.Fields(rest)
			}
		}
		if len(nspid) < 2 || nspid[0] != fmt.Sprint(host) || nspid[len(nspid)-1] != "1" {
			t.Errorf("NSpid of host pid %d = %v, want [%d ... 1]", host, nspid, host)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", host))
		if !strings.HasPrefix(string(cmdline), "/.sandboxd/agent\x00") && string(cmdline) != "/.sandboxd/agent" {
			t.Errorf("host pid %d runs %q, want the agent", host, cmdline)
		}
		res := env.sh(t, id, fmt.Sprintf("test -e /proc/%d && echo visible || echo hidden", host))
		if got := strings.TrimSpace(res.Stdout); got != "hidden" {
			t.Errorf("the agent's host pid %d inside the sandbox: %s", host, got)
		}
	})
}

func TestMemoryBombOOM(t *testing.T) {
	env := newTestEngine(t)
	info := env.create(t, CreateSandboxRequest{MemoryMB: ptr[int64](64)})
	res := env.sh(t, info.ID, `x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done`, 60)
	if res.Termination.Cause != sandbox.CauseOOM {
		t.Fatalf("memory bomb: cause %s (%s), exit %d, want oom", res.Termination.Cause, res.Termination.Detail, res.ExitCode)
	}
	// The sandbox, and the daemon, carry on.
	if res := env.sh(t, info.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Fatalf("after OOM: %q %q", res.Stdout, res.Stderr)
	}
	other := env.create(t, CreateSandboxRequest{})
	if res := env.sh(t, other.ID, "echo ok"); res.Stdout != "ok\n" {
		t.Fatalf("new sandbox after OOM: %q", res.Stdout)
	}
}

// jobsPids reads the pids.current of the cgroup that every job of sandbox
// info shares, whose pids.max is the sandbox's pids limit (the agent's
// threads count against agent.PidsReserve above it; pkg/agent/server's
// jobsCgroup).
func jobsPids(t *testing.T, info *sandbox.Info) uint64 {
	t.Helper()
	dir := filepath.Join(cgroups.Root, info.CgroupPath, "jobs")
	if cgroups.HostMode() != cgroups.ModeUnified {
		dir = filepath.Join(cgroups.Root, "pids", info.CgroupPath, "jobs")
	}
	b, err := os.ReadFile(filepath.Join(dir, "pids.current"))
	if err != nil {
		t.Fatalf("the jobs' pids: %v", err)
	}
	var n uint64
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		t.Fatalf("the jobs' pids.current %q: %v", b, err)
	}
	return n
}

func TestForkBombHeldByPidsLimit(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	const limit = 32
	info := env.create(t, CreateSandboxRequest{Pids: ptr[int64](limit)})
	// The commands' tasks: at most the limit, and the spare job helper
	// (one task), which joins its job's cgroup as it is forked, full or not.
	checkPids := func(what string, atLeast uint64) {
		t.Helper()
		if p := jobsPids(t, info); p > limit+1 || p < atLeast {
			t.Fatalf("%s: the commands' pids = %d, want the limit of %d reached, not exceeded", what, p, limit)
		}
		u, err := env.GetSandbox(ctx, info.ID)
		if err != nil || u.Usage == nil {
			t.Fatalf("usage: %v", err)
		}
		if u.Usage.Pids > limit+agent.PidsReserve {
			t.Fatalf("%s: the sandbox's pids = %d, over %d+%d", what, u.Usage.Pids, limit, agent.PidsReserve)
		}
	}
	// 200 background sleeps: the pids limit refuses most of them and the
	// shell gives up ("Cannot fork").
	res := env.sh(t, info.ID, `for i in $(seq 200); do sleep 3 & done; echo all started`, 20)
	if strings.Contains(res.Stdout, "all started") || !strings.Contains(res.Stderr, "fork") {
		t.Fatalf("200 forks under pids=32: %+v", res)
	}
	checkPids("200 sleeps", 16)
	// Once the sleeps end the sandbox is usable again.
	time.Sleep(3500 * time.Millisecond)
	if res := env.sh(t, info.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Fatalf("sandbox unusable after the sleeps ended: %+v", res)
	}
	// A classic fork bomb is held at the limit until the sandbox is terminated.
	env.sh(t, info.ID, `b(){ b|b& }; b`, 3)
	for i := 0; i < 10; i++ {
		checkPids("a fork bomb", 0)
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatalf("terminate a fork-bombed sandbox: %v", err)
	}
	env.assertNoLeftovers(t)
}

// TestPidsLimitSparesTheAgent: the commands' pids limit is theirs alone.
// While their processes hold all of it, the agent still serves files and
// starts commands (which run, though they cannot fork), and it starts the
// threads that takes from agent.PidsReserve. When the agent shared the
// limit, a thread it could not start killed it, and the sandbox with it.
func TestPidsLimitSparesTheAgent(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	const limit = 16
	info := env.create(t, CreateSandboxRequest{Pids: ptr[int64](limit)})
	// Sleeps until the shell cannot fork another: they hold the limit.
	res := env.sh(t, info.ID, `for i in $(seq 100); do sleep 60 & done; echo all started`, 20)
	if strings.Contains(res.Stdout, "all started") || !strings.Contains(res.Stderr, "fork") {
		t.Fatalf("100 sleeps under pids=%d: %+v", limit, res)
	}
	// All of it but the shell's own, which has exited.
	if p := jobsPids(t, info); p < limit-1 {
		t.Fatalf("the sleeps hold %d pids, want the limit of %d but one", p, limit)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p := fmt.Sprintf("/workspace/f%d", i)
			if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: p, Content: p}); err != nil {
				t.Errorf("write %s with the pids limit reached: %v", p, err)
				return
			}
			if r, err := env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: p}); err != nil || r.Content != p {
				t.Errorf("read %s with the pids limit reached: %+v, %v", p, r, err)
			}
			res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: fmt.Sprintf("echo ok-%d", i)}, nil)
			if err != nil || res.Stdout != fmt.Sprintf("ok-%d\n", i) || res.ExitCode != 0 {
				t.Errorf("a command with the pids limit reached: %+v, %v", res, err)
			}
		})
	}
	wg.Wait()
	// The shell cannot fork cat, but it can become it.
	if res := env.sh(t, info.ID, "exec cat /workspace/f7"); res.Stdout != "/workspace/f7" {
		t.Fatalf("a command reading a file written with the pids limit reached: %+v", res)
	}
	if p := jobsPids(t, info); p > limit+1 {
		t.Errorf("the commands' pids = %d, over the limit of %d", p, limit)
	}
}

func TestDiskLimitENOSPC(t *testing.T) {
	env := newTestEngine(t)
	info := env.create(t, CreateSandboxRequest{DiskMB: ptr[int64](32)})
	// A disk of its own (not the pool's geometry), mounted without
	// barriers like a pooled one (storage.MountScratch).
	res := env.sh(t, info.ID, "grep ' /workspace ' /proc/self/mountinfo")
	if !strings.Contains(res.Stdout, " ext4 ") || !strings.Contains(res.Stdout, "nobarrier") {
		t.Errorf("/workspace's mount: %q %q, want ext4 with nobarrier", res.Stdout, res.Stderr)
	}
	res = env.sh(t, info.ID, "head -c 64M /dev/zero > /workspace/big; echo rc=$?; ls -s --block-size=1M /workspace/big")
	if !strings.Contains(res.Stderr, "No space left on device") || !strings.Contains(res.Stdout, "rc=1") {
		t.Fatalf("writing past the disk limit: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	// /tmp shares the same budget.
	res = env.sh(t, info.ID, "head -c 8M /dev/zero > /tmp/more; echo rc=$?")
	if !strings.Contains(res.Stdout, "rc=1") {
		t.Errorf("/tmp write with a full disk: %q %q", res.Stdout, res.Stderr)
	}
	res = env.sh(t, info.ID, "rm /workspace/big && head -c 8M /dev/zero > /tmp/more; echo rc=$?")
	if !strings.Contains(res.Stdout, "rc=0") {
		t.Errorf("write after freeing space: %q %q", res.Stdout, res.Stderr)
	}
}

// agentProcs lists the host pids in cgroup p but the agent's spare job
// helper (pkg/agent/server/spare.go), which waits there for the next
// command. The next spare is started as a command takes the last one: until
// it has exec'd its __job-spare form (a while on a slow TCG guest) it looks
// like a second agent, so agentProcs waits up to 5 s for the agent to be
// alone and returns what it saw last.
func agentProcs(p string) ([]int, error) {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		all, err := cgroups.Procs(p)
		var out []int
		for _, pid := range all {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if !strings.Contains(string(cmd), "\x00__job-spare\x00") {
				out = append(out, pid)
			}
		}
		if err != nil || len(out) <= 1 || time.Now().After(deadline) {
			return out, err
		}
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	env := newTestEngine(t)
	info := env.create(t, CreateSandboxRequest{})
	start := time.Now()
	res := env.sh(t, info.ID, "sleep 1000 & while true; do :; done", 2)
	if res.Termination.Cause != sandbox.CauseTimeout {
		t.Fatalf("cause = %s, want timeout", res.Termination.Cause)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("timeout of 2s took %s", d)
	}
	// Nothing of the command survives, not even its background sleep.
	res = env.sh(t, info.ID, "ps -e -o comm= | grep -c '^sleep$'")
	if got := strings.TrimSpace(res.Stdout); got != "0" {
		t.Errorf("sleep processes after timeout: %q", got)
	}
	// The cgroup agrees, seen from the host: only the agent is left (and
	// its spare job helper, which waits for the next command).
	procs, err := agentProcs(info.CgroupPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 {
		out := env.sh(t, info.ID, "ps -e -o pid,stat,comm")
		t.Errorf("processes in the sandbox cgroup after timeout = %v, want only the agent:\n%s", procs, out.Stdout)
	}
}

// TestTimeoutKillsEscapedProcesses: processes that leave the command's
// session (setsid), double-fork or ignore SIGHUP (nohup) still die with a
// timed-out command, because the job's own cgroup is emptied. Checked from
// the host's /proc, not through the sandbox.
func TestTimeoutKillsEscapedProcesses(t *testing.T) {
	requireRoot(t)
	env := newTestEngine(t)
	info := env.create(t, CreateSandboxRequest{})
	script := `setsid sleep 1001 & (setsid sh -c "sleep 1003" &); (nohup sleep 1005 >/dev/null 2>&1 &); sleep 100`
	start := time.Now()
	res := env.sh(t, info.ID, script, 3)
	if res.Termination.Cause != sandbox.CauseTimeout {
		t.Fatalf("cause = %s (%s), want timeout", res.Termination.Cause, res.Termination.Detail)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("3s timeout took %s", d)
	}
	if res.Usage == nil {
		t.Errorf("result has no per-job usage")
	}
	if left := hostProcsOf(t, info.ID, "sleep"); len(left) > 0 {
		t.Fatalf("processes of the timed-out command survive on the host: %v", left)
	}

	// A busy command's usage is its own, not the sandbox's.
	res = env.sh(t, info.ID, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\\0' a); echo ${#x}")
	if res.Usage == nil || res.Usage.CPUSeconds < 0.05 {
		t.Errorf("usage of a busy command = %+v, want some CPU time", res.Usage)
	} else if res.Usage.MemoryPeakBytes < 20<<20 {
		t.Errorf("memory peak of a command buffering 30 MB = %d", res.Usage.MemoryPeakBytes)
	}
}

// hostProcsOf lists "pid cmdline" of the host's processes in sandbox id's
// cgroups whose command is comm.
func hostProcsOf(t *testing.T, id, comm string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/"+id) {
			continue
		}
		c, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if strings.TrimSpace(string(c)) != comm {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return out
}

// TestCPUQuota runs a busy loop under a 0.5-core quota beside one under
// 2 cores, at the same time: the control shows what the machine could
// give, so a busy machine (other tests, a load average of 12 on two cores)
// does not pass for a working quota or fail a working one.
func TestCPUQuota(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	limited := env.create(t, CreateSandboxRequest{CPUs: ptr(0.5)})
	control := env.create(t, CreateSandboxRequest{CPUs: ptr(2.0)})
	type sample struct{ share, throttled float64 }
	measure := func() (lim, ctl sample) {
		var wg sync.WaitGroup
		run := func(id string, out *sample) {
			defer wg.Done()
			before, err := env.GetSandbox(ctx, id)
			if err != nil {
				t.Error(err)
				return
			}
			start := time.Now()
			res := env.sh(t, id, "while true; do :; done", 4)
			wall := time.Since(start).Seconds()
			after, err := env.GetSandbox(ctx, id)
			if err != nil {
				t.Error(err)
				return
			}
			if res.Termination.Cause != sandbox.CauseTimeout {
				t.Errorf("busy loop: cause %s", res.Termination.Cause)
			}
			out.share = (after.Usage.CPUSeconds - before.Usage.CPUSeconds) / wall
			out.throttled = after.Usage.CPUThrottledSec - before.Usage.CPUThrottledSec
		}
		wg.Add(2)
		go run(limited.ID, &lim)
		go run(control.ID, &ctl)
		wg.Wait()
		return lim, ctl
	}
	for attempt := 1; ; attempt++ {
		lim, ctl := measure()
		t.Logf("attempt %d: under 0.5 cores %.2f of a core (throttled %.2fs); under 2 cores %.2f", attempt, lim.share, lim.throttled, ctl.share)
		if lim.share > 0.6 {
			t.Fatalf("CPU share under a 0.5 quota = %.2f, want at most about 0.5", lim.share)
		}
		if ctl.share >= 0.75 {
			// The machine had more than the quota to give.
			if lim.throttled <= 0 {
				t.Errorf("the loop under a 0.5 quota was never throttled while the control got %.2f of a core", ctl.share)
			}
			if lim.share < 0.35 {
				t.Errorf("CPU share under a 0.5 quota = %.2f while the control got %.2f, want about 0.5", lim.share, ctl.share)
			}
			return
		}
		if attempt == 3 {
			t.Logf("the machine never had more than %.2f of a core to give: only the ceiling could be checked", ctl.share)
			return
		}
	}
}

func TestConcurrentSandboxes(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", MemoryMB: ptr[int64](64)})
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: fmt.Sprintf("echo %d > /workspace/n; cat /workspace/n; hostname", i)}, nil)
			if err != nil {
				errs <- fmt.Errorf("exec %d: %w", i, err)
			} else if want := fmt.Sprintf("%d\n%s\n", i, info.ID); res.Stdout != want {
				errs <- fmt.Errorf("sandbox %d: stdout %q, want %q", i, res.Stdout, want)
			}
			if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
				errs <- fmt.Errorf("terminate %d: %w", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	env.assertNoLeftovers(t)
	live, err := env.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Errorf("%d sandboxes still listed live", len(live))
	}
	all, _ := env.ListSandboxes(ctx, "terminated")
	if len(all) != n {
		t.Errorf("%d terminated sandboxes recorded, want %d", len(all), n)
	}
}

func TestBadInput(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) { c.Sandbox.MaxSandboxes = 2 })
	ctx := context.Background()
	live := env.create(t, CreateSandboxRequest{})
	dead := env.create(t, CreateSandboxRequest{})
	if _, err := env.TerminateSandbox(ctx, dead.ID); err != nil {
		t.Fatal(err)
	}
	countBefore, _ := env.store.CountSandboxes(ctx)

	cases := []struct {
		name string
		call func() error
		code errdefs.Code
		in   string // the message must name this field
	}{
		{"unknown image", func() error { _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Image: "nope"}); return err }, errdefs.InvalidArgument, "image"},
		{"unknown language", func() error { _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "cobol"}); return err }, errdefs.InvalidArgument, "language"},
		{"no language", func() error { _, err := env.CreateSandbox(ctx, CreateSandboxRequest{}); return err }, errdefs.InvalidArgument, "language"},
		{"negative memory", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", MemoryMB: ptr[int64](-5)})
			return err
		}, errdefs.InvalidArgument, "memory_mb"},
		{"memory over cap", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", MemoryMB: ptr[int64](1 << 20)})
			return err
		}, errdefs.InvalidArgument, "memory_mb"},
		{"cpus over cap", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", CPUs: ptr(64.0)})
			return err
		}, errdefs.InvalidArgument, "cpus"},
		{"negative pids", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Pids: ptr[int64](-1)})
			return err
		}, errdefs.InvalidArgument, "pids"},
		{"disk over cap", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", DiskMB: ptr[int64](1 << 30)})
			return err
		}, errdefs.InvalidArgument, "disk_mb"},
		// Numbers that overflow once scaled (MiB to bytes, seconds to a
		// duration) are invalid_argument naming the field, never wrapped.
		{"memory_mb overflowing", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", MemoryMB: ptr[int64](math.MaxInt64)})
			return err
		}, errdefs.InvalidArgument, "memory_mb"},
		{"disk_mb overflowing", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", DiskMB: ptr[int64](math.MaxInt64/(1<<20) + 1)})
			return err
		}, errdefs.InvalidArgument, "disk_mb"},
		{"ttl_seconds overflowing", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", TTLSeconds: ptr[int64](math.MaxInt64)})
			return err
		}, errdefs.InvalidArgument, "ttl_seconds"},
		{"exec timeout overflowing", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: live.ID, Command: "true", TimeoutSeconds: ptr(1e300)}, nil)
			return err
		}, errdefs.InvalidArgument, "timeout_seconds"},
		{"run_code timeout overflowing", func() error {
			_, err := env.RunCode(ctx, RunCodeRequest{Language: "shell", Code: "true", TimeoutSeconds: ptr(float64(math.MaxInt64))}, nil)
			return err
		}, errdefs.InvalidArgument, "timeout_seconds"},
		{"agent timeout overflowing", func() error {
			_, err := env.AgentRun(ctx, AgentRunRequest{Prompt: "x", TimeoutSeconds: math.Inf(1)}, nil)
			return err
		}, errdefs.InvalidArgument, "timeout"},
		{"bad network", func() error {
			_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Network: "bridge"})
			return err
		}, errdefs.InvalidArgument, "network"},
		{"max_sandboxes", func() error {
			// One live sandbox plus this one would fit, so create one more first.
			extra, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
			if err != nil {
				return fmt.Errorf("unexpected: %w", err)
			}
			defer env.TerminateSandbox(ctx, extra.ID)
			_, err = env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
			return err
		}, errdefs.LimitExceeded, "max_sandboxes"},
		{"exec on terminated", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: dead.ID, Command: "true"}, nil)
			return err
		}, errdefs.Conflict, "terminated"},
		{"exec on unknown", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: "sb-000000000000", Command: "true"}, nil)
			return err
		}, errdefs.NotFound, "sandbox_id"},
		{"empty argv", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: live.ID, Argv: []string{}}, nil)
			return err
		}, errdefs.InvalidArgument, "command"},
		{"empty argv[0]", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: live.ID, Argv: []string{""}}, nil)
			return err
		}, errdefs.InvalidArgument, "argv[0]"},
		{"negative timeout", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: live.ID, Command: "true", TimeoutSeconds: ptr(-1.0)}, nil)
			return err
		}, errdefs.InvalidArgument, "timeout_seconds"},
		{"relative path", func() error {
			_, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: live.ID, Path: "workspace/x", Content: "x"})
			return err
		}, errdefs.InvalidArgument, "path"},
		{"setuid mode", func() error {
			_, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: live.ID, Path: "/workspace/x", Content: "x", Mode: "4755"})
			return err
		}, errdefs.InvalidArgument, "mode"},
		{"NUL in path", func() error {
			_, err := env.ReadFile(ctx, FileReadRequest{SandboxID: live.ID, Path: "/workspace/a\x00b"})
			return err
		}, errdefs.InvalidArgument, "path"},
		{"relative cwd", func() error {
			_, err := env.Exec(ctx, ExecRequest{SandboxID: live.ID, Command: "true", Cwd: "tmp"}, nil)
			return err
		}, errdefs.InvalidArgument, "cwd"},
		{"read missing file", func() error {
			_, err := env.ReadFile(ctx, FileReadRequest{SandboxID: live.ID, Path: "/workspace/missing"})
			return err
		}, errdefs.NotFound, ""},
		{"file on terminated", func() error {
			_, err := env.ListFiles(ctx, dead.ID, "/workspace", false)
			return err
		}, errdefs.Conflict, "terminated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if got := errdefs.CodeOf(err); got != c.code {
				t.Fatalf("code = %q (%v), want %q", got, err, c.code)
			}
			if !strings.Contains(errdefs.MessageOf(err), c.in) {
				t.Errorf("message %q does not name %q", errdefs.MessageOf(err), c.in)
			}
		})
	}
	// Nothing changed: the same sandboxes, the live one still usable.
	countAfter, _ := env.store.CountSandboxes(ctx)
	if countAfter != countBefore+1 { // +1: the extra sandbox of the max_sandboxes case
		t.Errorf("sandbox records %d -> %d, want only the extra one added", countBefore, countAfter)
	}
	if res := env.sh(t, live.ID, "ls /workspace | wc -l"); strings.TrimSpace(res.Stdout) != "2" {
		t.Errorf("workspace of the live sandbox changed: %q", res.Stdout)
	}
}

func TestFiles(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	w, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: "/workspace/src/main.sh", Content: "echo from file\n", Mode: "0755"})
	if err != nil {
		t.Fatal(err)
	}
	if w.Size != 15 {
		t.Errorf("size = %d", w.Size)
	}
	res := env.sh(t, info.ID, "/workspace/src/main.sh; stat -c '%u %a' /workspace/src/main.sh")
	if res.Stdout != "from file\n1000 755\n" {
		t.Errorf("run written file: %q %q", res.Stdout, res.Stderr)
	}
	r, err := env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: "/workspace/src/main.sh"})
	if err != nil || r.Content != "echo from file\n" || r.Encoding != "utf-8" {
		t.Fatalf("read back = %+v, %v", r, err)
	}
	env.sh(t, info.ID, "printf '\\377\\376' > /workspace/bin.dat")
	r, err = env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: "/workspace/bin.dat"})
	if err != nil || r.Encoding != "base64" || r.Content != "//4=" {
		t.Errorf("binary read = %+v, %v", r, err)
	}
	// A symlink planted inside the sandbox resolves inside it, never on the host.
	env.sh(t, info.ID, "ln -s /etc/hostname /workspace/link")
	r, err = env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: "/workspace/link"})
	if err != nil || r.Content != info.ID+"\n" {
		t.Errorf("symlink read = %+v, %v; want the sandbox's own /etc/hostname", r, err)
	}
	list, err := env.ListFiles(ctx, info.ID, "/workspace", true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Path)
	}
	for _, want := range []string{"/workspace/src", "/workspace/src/main.sh", "/workspace/bin.dat", "/workspace/link"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("list misses %s: %v", want, names)
		}
	}
	if _, err := env.DeleteFile(ctx, info.ID, "/workspace/src", true); err != nil {
		t.Fatal(err)
	}
	if res := env.sh(t, info.ID, "test -e /workspace/src && echo present || echo gone"); res.Stdout != "gone\n" {
		t.Errorf("after delete: %q", res.Stdout)
	}
	if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: "/etc/passwd", Content: "x"}); err == nil {
		t.Error("writing to the read-only root succeeded")
	}
}

func TestIdleTimeoutReaper(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) { c.Sandbox.IdleTimeout = config.Duration(time.Second) })
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		got, err := env.GetSandbox(ctx, info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateTerminated {
			if !strings.Contains(got.Reason, "idle") {
				t.Errorf("termination reason %q does not mention idleness", got.Reason)
			}
			env.assertNoLeftovers(t)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("idle sandbox was not reaped within 15s")
}

func TestTTLReaper(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{TTLSeconds: ptr[int64](1)})
	if info.ExpiresAt == nil {
		t.Fatal("no expires_at for a sandbox with a TTL")
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		got, _ := env.GetSandbox(ctx, info.ID)
		if got.State == sandbox.StateTerminated {
			if !strings.Contains(got.Reason, "lifetime") {
				t.Errorf("reason %q", got.Reason)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox outlived its TTL")
}

// TestConcurrentExecAndTerminate races commands on one sandbox against its
// termination: every call ends with a result or a taxonomy error, the state
// machine never takes an illegal step, and nothing is left behind.
func TestConcurrentExecAndTerminate(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(i%10) * 20 * time.Millisecond)
			res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: "sleep 0.1; echo ok"}, nil)
			switch {
			case err != nil:
				if c := errdefs.CodeOf(err); c != errdefs.Conflict && c != errdefs.Unavailable {
					errs <- fmt.Errorf("exec %d: unexpected error %v", i, err)
				}
			case res.Termination.Cause == sandbox.CauseExited:
				if res.Stdout != "ok\n" {
					errs <- fmt.Errorf("exec %d: stdout %q", i, res.Stdout)
				}
			case res.Termination.Cause != sandbox.CauseKilled:
				errs <- fmt.Errorf("exec %d: cause %s (%s)", i, res.Termination.Cause, res.Termination.Detail)
			}
		}(i)
	}
	time.Sleep(100 * time.Millisecond)
	for i := 0; i < 3; i++ { // concurrent terminates are idempotent
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
				errs <- fmt.Errorf("terminate: %w", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, err := env.GetSandbox(ctx, info.ID)
	if err != nil || got.State != sandbox.StateTerminated {
		t.Fatalf("final state %v, %v", got, err)
	}
	evs, err := env.store.Events(ctx, info.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(evs); i++ {
		from, to := sandbox.State(evs[i].From), sandbox.State(evs[i].To)
		if evs[i-1].To != evs[i].From || !sandbox.CanTransition(from, to) {
			t.Errorf("event %d: %s -> %s after %s", i, from, to, evs[i-1].To)
		}
	}
	env.assertNoLeftovers(t)
}

// TestIOThrottle checks that configured block I/O throttles reach the
// kernel for the disk that holds the images.
func TestIOThrottle(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) {
		c.Sandbox.IOReadBPS = 8 << 20
		c.Sandbox.IOWriteBPS = 4 << 20
	})
	if !cgroups.IOControllerAvailable() {
		t.Fatal("no block I/O controller on this host")
	}
	dev, err := cgroups.BlockDeviceOf(env.cfg.Paths.ImagesDir)
	if err != nil {
		t.Fatal(err)
	}
	info := env.create(t, CreateSandboxRequest{})
	var got string
	if cgroups.HostMode() == cgroups.ModeUnified {
		b, _ := os.ReadFile(filepath.Join(cgroups.Root, info.CgroupPath, "io.max"))
		got = string(b)
		if !strings.Contains(got, dev+" rbps=8388608 wbps=4194304") {
			t.Errorf("io.max = %q, want rbps/wbps on %s", got, dev)
		}
	} else {
		for file, want := range map[string]string{
			"blkio.throttle.read_bps_device":  dev + " 8388608",
			"blkio.throttle.write_bps_device": dev + " 4194304",
		} {
			b, _ := os.ReadFile(filepath.Join(cgroups.Root, "blkio", info.CgroupPath, file))
			if strings.TrimSpace(string(b)) != want {
				t.Errorf("%s = %q, want %q", file, b, want)
			}
		}
	}
}

// TestWarmPool: with sandbox.pool set, default requests get a warm sandbox
// at once (with their own environment and labels), custom ones a new
// sandbox, and the pool refills.
func TestWarmPool(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) { c.Sandbox.Pool = map[string]int{"shell": 2} })
	ctx := context.Background()
	warm := func() []string {
		var ids []string
		l, err := env.ListSandboxes(ctx, "ready")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l {
			if s.Labels[sandbox.PoolLabel] == "warm" {
				ids = append(ids, s.ID)
			}
		}
		return ids
	}
	waitWarm := func(n int) []string {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if ids := warm(); len(ids) == n {
				return ids
			}
		}
		t.Fatalf("the pool never reached %d warm sandboxes (has %v)", n, warm())
		return nil
	}
	pool := waitWarm(2)

	info := env.create(t, CreateSandboxRequest{Env: map[string]string{"GREETING": "hi"}, Labels: map[string]string{"owner": "test"}})
	if !slices.Contains(pool, info.ID) {
		t.Fatalf("a default request got %s, not one of the warm %v", info.ID, pool)
	}
	if info.Labels["owner"] != "test" || info.Labels[sandbox.PoolLabel] != "" {
		t.Errorf("claimed sandbox labels = %v", info.Labels)
	}
	if res := env.sh(t, info.ID, "echo $GREETING"); res.Stdout != "hi\n" {
		t.Errorf("claimed sandbox env: %q", res.Stdout)
	}
	// The pool refills behind the claim.
	for _, id := range waitWarm(2) {
		if id == info.ID {
			t.Errorf("claimed sandbox %s is still in the pool", id)
		}
	}
	// A request with its own limits gets a sandbox of its own.
	custom := env.create(t, CreateSandboxRequest{MemoryMB: ptr[int64](64)})
	if slices.Contains(warm(), custom.ID) || slices.Contains(pool, custom.ID) {
		t.Errorf("a custom request got a warm sandbox %s", custom.ID)
	}
	if custom.Limits.MemoryBytes != 64<<20 {
		t.Errorf("custom sandbox limits %+v", custom.Limits)
	}
}

// TestWriteFillingDiskLeavesNothing: a file write that fills the sandbox's
// disk answers limit_exceeded and leaves the previous content (or no
// file), never a partial one.
func TestWriteFillingDiskLeavesNothing(t *testing.T) {
	requireRoot(t)
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{DiskMB: ptr[int64](32)})
	if _, err := env.WriteFileFrom(ctx, info.ID, "/workspace/keep.txt", "", false, 3, strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	const size = 48 << 20
	for _, p := range []string{"/workspace/keep.txt", "/workspace/new.bin"} {
		_, err := env.WriteFileFrom(ctx, info.ID, p, "", false, size, io.LimitReader(zeroReader{}, size))
		if !errdefs.Is(err, errdefs.LimitExceeded) {
			t.Fatalf("write of %d MiB to a 32 MiB disk at %s: %v, want limit_exceeded", size>>20, p, err)
		}
	}
	res := env.sh(t, info.ID, "cat /workspace/keep.txt; echo; ls -A /workspace | grep -c sandboxd-tmp; ls -A /workspace")
	lines := strings.Split(res.Stdout, "\n")
	if len(lines) < 2 || lines[0] != "old" || strings.TrimSpace(lines[1]) != "0" || strings.Contains(res.Stdout, "new.bin") {
		t.Errorf("after the failed writes: %q (want the old content and no other file)", res.Stdout)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestFileReadObeysSandboxUserPermissions: the file API reads with the
// sandbox user's credentials, so a link planted in /workspace pointing at a
// root-only file of the image does not hand that file out.
func TestFileReadObeysSandboxUserPermissions(t *testing.T) {
	requireRoot(t)
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	env.sh(t, info.ID, "ln -s /etc/shadow /workspace/x; echo mine > /workspace/mine")
	if _, err := env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: "/workspace/x"}); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("file_read through a link to /etc/shadow: %v, want invalid_argument (permission denied)", err)
	}
	if _, err := env.ListFiles(ctx, info.ID, "/root", false); err == nil {
		t.Errorf("listing /root (0700 root) succeeded")
	}
	res, err := env.ReadFile(ctx, FileReadRequest{SandboxID: info.ID, Path: "/workspace/mine"})
	if err != nil || res.Content != "mine\n" {
		t.Errorf("reading the user's own file: %+v %v", res, err)
	}
	// Writes and deletes too: a directory the user made read-only stays so
	// for the file API (the agent's CAP_DAC_OVERRIDE does not apply).
	env.sh(t, info.ID, "mkdir /workspace/ro; echo keep > /workspace/ro/f; chmod 0555 /workspace/ro")
	if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: "/workspace/ro/new", Content: "x"}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("file_write into a 0555 directory: %v, want permission denied", err)
	}
	if _, err := env.DeleteFile(ctx, info.ID, "/workspace/ro/f", false); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("deleting from a 0555 directory: %v, want permission denied", err)
	}
	if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: "/workspace/new/f", Content: "x"}); err != nil {
		t.Errorf("file_write of the user's own new file: %v", err)
	}
	if out := env.sh(t, info.ID, "stat -c %u:%g /workspace/new /workspace/new/f; cat /workspace/ro/f").Stdout; out != "1000:1000\n1000:1000\nkeep\n" {
		t.Errorf("owners and the kept file: %q", out)
	}
}
