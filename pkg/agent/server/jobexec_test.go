package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// The C job-exec helper (jobexec.c) is a constructor of every binary that
// links this package, the test binary too: these tests run it as the agent
// does, in both of its forms, and read what the command it became was
// given. Jobs in a sandbox run through it in the engine's and the
// container's integration tests; here each protection is checked on its
// own, with the failures the agent must be told about.

// helperRun is one start of the helper: its command's output and the
// helper's report (nil once the command ran).
type helperRun struct {
	out    string
	status error
	exit   int
}

// runDirect starts the direct form (helperArgv) with the command's stdout
// and stderr on a pipe and the status pipe on descriptor 3.
func runDirect(t *testing.T, c jobCreds, dir string, procs []string, path string, argv ...string) helperRun {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := helperArgv(self, c, dir, procs, path, argv)
	return runHelper(t, args, nil)
}

// runHelper runs args with the status (or control) descriptor as fd 3;
// send, when set, talks to the helper on it (the spare form) and returns
// the descriptor the report is then read from.
func runHelper(t *testing.T, args []string, send func(ctl *os.File, stdout *os.File) *os.File) helperRun {
	t.Helper()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	var parent, child *os.File
	if send == nil {
		parent, child, err = os.Pipe()
	} else {
		var fds [2]int
		fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		parent, child = os.NewFile(uintptr(fds[0]), "ctl"), os.NewFile(uintptr(fds[1]), "spare")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HELPER_TEST=direct"}
	if send == nil {
		cmd.Stdout, cmd.Stderr = outW, outW
	}
	cmd.ExtraFiles = []*os.File{child}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	report := parent
	if send != nil {
		report = send(parent, outW)
	}
	outW.Close()
	var r helperRun
	if report != nil {
		_ = report.SetReadDeadline(time.Now().Add(10 * time.Second))
		r.status = helperStatus(report)
	}
	parent.Close()
	out, err := readAllBounded(outR)
	if err != nil {
		t.Fatal(err)
	}
	r.out = out
	_ = cmd.Wait()
	r.exit = cmd.ProcessState.ExitCode()
	return r
}

func readAllBounded(f *os.File) (string, error) {
	var b bytes.Buffer
	_ = f.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := b.ReadFrom(f)
	return b.String(), err
}

// statusProbe prints what the kernel says of the process the helper
// became: its credentials, capability sets, OOM score, cgroups and cwd.
var statusProbe = []string{"sh", "-c", `grep -E '^(Uid|Gid|Groups|Cap[A-Za-z]+|NoNewPrivs):' /proc/self/status; echo "oom: $(cat /proc/self/oom_score_adj)"; echo "cwd: $(pwd)"; echo "env: $HELPER_TEST"; cat /proc/self/cgroup`}

// checkDropped asserts that the helper ran its job (status, exit 0) as a
// process that lost every privilege, in directory dir, with environment
// env (HELPER_TEST) and in cgroup cg.
func checkDropped(t *testing.T, r helperRun, dir, env, cg string) {
	t.Helper()
	if r.status != nil || r.exit != 0 {
		t.Fatalf("status %v, exit %d:\n%s", r.status, r.exit, r.out)
	}
	for _, want := range []string{
		"Uid:\t1000\t1000\t1000\t1000", "Gid:\t1000\t1000\t1000\t1000", "Groups:\t1000 ",
		"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000",
		"oom: 500", "cwd: " + dir, "env: " + env, "::" + cg,
	} {
		if !strings.Contains(r.out, want+"\n") {
			t.Errorf("the job's process lacks %q:\n%s", want, r.out)
		}
	}
}

// testCgroup makes a cgroup of the unified hierarchy for one test and
// returns its cgroup.procs file and its path as /proc/PID/cgroup shows it.
func testCgroup(t *testing.T) (procs, name string) {
	t.Helper()
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup/unified" // a hybrid host
	}
	name = fmt.Sprintf("sandboxd-jobexec-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("a test cgroup: %v", err)
	}
	t.Cleanup(func() {
		// The job has exited; its cgroup empties as it is reaped.
		for deadline := time.Now().Add(5 * time.Second); ; {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("remove test cgroup: %v", err)
				return
			}
			time.Sleep(10 * time.Millisecond) // polling the kernel's release of the cgroup
		}
	})
	return filepath.Join(dir, "cgroup.procs"), "/" + name
}

func TestJobExecHelperDirectDropsEverything(t *testing.T) {
	testenv.RequireRoot(t)
	procs, cg := testCgroup(t)
	r := runDirect(t, jobCreds{uid: 1000, gid: 1000}, "/", []string{procs}, "/bin/sh", statusProbe...)
	checkDropped(t, r, "/", "direct", cg)
}

func TestJobExecHelperKeepsCapabilitiesOnlyWhenAsked(t *testing.T) {
	testenv.RequireRoot(t)
	own, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var bnd string
	for _, l := range strings.Split(string(own), "\n") {
		if strings.HasPrefix(l, "CapBnd:") {
			bnd = l
		}
	}
	r := runDirect(t, jobCreds{uid: 0, gid: 0, keepCaps: true}, "/", nil, "/bin/sh", statusProbe...)
	if r.status != nil || !strings.Contains(r.out, bnd+"\n") || !strings.Contains(r.out, "Uid:\t0\t0\t0\t0\n") {
		t.Errorf("keep: status %v, want %q:\n%s", r.status, bnd, r.out)
	}
	r = runDirect(t, jobCreds{uid: 0, gid: 0}, "/", nil, "/bin/sh", statusProbe...)
	if r.status != nil || !strings.Contains(r.out, "CapBnd:\t0000000000000000\n") || !strings.Contains(r.out, "CapEff:\t0000000000000000\n") {
		t.Errorf("drop as uid 0: status %v, want no capability:\n%s", r.status, r.out)
	}
}

func TestJobExecHelperReportsFailures(t *testing.T) {
	testenv.RequireRoot(t)
	private := t.TempDir() // 0700, root's: uid 1000 may not enter it
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	user := jobCreds{uid: 1000, gid: 1000}
	for _, tc := range []struct {
		name     string
		c        jobCreds
		args     []string // uid gid caps: replaced when set
		dir      string
		procs    []string
		path     string
		errno    syscall.Errno
		msg      string
		suffixed bool
	}{
		{name: "missing executable", c: user, dir: "/", path: "/no/such/binary", errno: unix.ENOENT, msg: "no such file or directory"},
		{name: "not executable", c: user, dir: "/", path: "/etc/passwd", errno: unix.EACCES, msg: "permission denied"},
		{name: "missing dir", c: user, dir: "/no/such/dir", path: "/bin/true", errno: unix.ENOENT, msg: "chdir /no/such/dir: no such file or directory"},
		{name: "dir the user may not enter", c: user, dir: private, path: "/bin/true", errno: unix.EACCES, msg: "chdir " + private + ": permission denied"},
		{name: "missing cgroup", c: user, dir: "/", procs: []string{"/sys/fs/cgroup/no-such-cgroup/cgroup.procs"}, path: "/bin/true", errno: unix.ENOENT, msg: "enter job cgroup: open /sys/fs/cgroup/no-such-cgroup/cgroup.procs: no such file or directory"},
		{name: "uid not a number", args: []string{"x", "1000", "drop"}, dir: "/", path: "/bin/true", errno: unix.EINVAL, msg: `bad credentials "x" "1000" "drop"`, suffixed: true},
		{name: "negative gid", args: []string{"1000", "-1", "drop"}, dir: "/", path: "/bin/true", errno: unix.EINVAL, msg: `bad credentials "1000" "-1" "drop"`, suffixed: true},
		{name: "uid out of range", args: []string{"2147483647", "1000", "drop"}, dir: "/", path: "/bin/true", errno: unix.EINVAL, msg: `bad credentials "2147483647" "1000" "drop"`, suffixed: true},
		{name: "caps neither keep nor drop", args: []string{"1000", "1000", "all"}, dir: "/", path: "/bin/true", errno: unix.EINVAL, msg: `bad credentials "1000" "1000" "all"`, suffixed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			args := helperArgv(self, tc.c, tc.dir, tc.procs, tc.path, []string{"job"})
			if tc.args != nil {
				copy(args[2:5], tc.args)
			}
			r := runHelper(t, args, nil)
			var he *helperError
			if !errors.As(r.status, &he) || !errors.Is(r.status, tc.errno) {
				t.Fatalf("status %v (exit %d), want errno %v", r.status, r.exit, tc.errno)
			}
			want := tc.msg
			if tc.suffixed {
				want += ": " + tc.errno.Error()
			}
			if he.Error() != want {
				t.Errorf("message %q, want %q", he.Error(), want)
			}
			if r.exit != 127 {
				t.Errorf("helper exit %d, want 127", r.exit)
			}
		})
	}
}

// spareSend returns a send function for runHelper that waits for the
// spare's "ready", then sends msg with the descriptors made by fds.
func spareSend(t *testing.T, msg []byte, nfds int) func(ctl, stdout *os.File) *os.File {
	return func(ctl, stdout *os.File) *os.File {
		t.Helper()
		buf := make([]byte, 64)
		_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := ctl.Read(buf)
		if err != nil || string(buf[:n]) != spareReady {
			t.Fatalf("spare said %q, %v", buf[:n], err)
		}
		null, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer null.Close()
		fds := []int{int(null.Fd()), int(stdout.Fd()), int(stdout.Fd())}[:nfds]
		var oob []byte
		if nfds > 0 {
			oob = unix.UnixRights(fds...)
		}
		if msg == nil {
			// The agent lets it go: no message, end of stream.
			if err := unix.Shutdown(int(ctl.Fd()), unix.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		if err := unix.Sendmsg(int(ctl.Fd()), msg, oob, nil, 0); err != nil {
			t.Fatal(err)
		}
		return ctl
	}
}

func runSpareHelper(t *testing.T, procs string, msg []byte, nfds int) helperRun {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return runHelper(t, []string{self, SpareArg, procs}, spareSend(t, msg, nfds))
}

func TestJobExecSpareDropsEverything(t *testing.T) {
	testenv.RequireRoot(t)
	procs, cg := testCgroup(t)
	spec := &spareSpec{Path: "/bin/sh", Argv: statusProbe, Env: []string{"HELPER_TEST=spare"}, Dir: "/tmp", UID: 1000, GID: 1000}
	r := runSpareHelper(t, procs, spec.encode(), 3)
	checkDropped(t, r, "/tmp", "spare", cg)
}

func TestJobExecSpareRefusesBadMessages(t *testing.T) {
	testenv.RequireRoot(t)
	good := (&spareSpec{Path: "/bin/true", Argv: []string{"true"}, Env: []string{"A=b"}, Dir: "/", UID: 1000, GID: 1000}).encode()
	z := func(s string) []byte { return []byte(strings.ReplaceAll(s, "|", "\x00")) }
	for _, tc := range []struct {
		name string
		msg  []byte
		nfds int
		want string
	}{
		{"no NUL at all", []byte("garbage"), 3, "command message: bad header"},
		{"uid not a number", z("x|1000|0|0|/|/bin/true|1|true|0|"), 3, "command message: bad header"},
		{"uid out of range", z("4294967295|1000|0|0|/|/bin/true|1|true|0|"), 3, "command message: bad header"},
		{"keep not 0 or 1", z("1000|1000|2|0|/|/bin/true|1|true|0|"), 3, "command message: bad header"},
		{"relative dir", z("1000|1000|0|0|tmp|/bin/true|1|true|0|"), 3, "command message: bad header"},
		{"empty path", z("1000|1000|0|0|/||1|true|0|"), 3, "command message: bad header"},
		{"no argv", z("1000|1000|0|0|/|/bin/true|0|0|"), 3, "command message: bad argv"},
		{"argc past the message", z("1000|1000|0|0|/|/bin/true|5|true|0|"), 3, "command message: bad argv"},
		{"argc too large", z("1000|1000|0|0|/|/bin/true|99999999|true|0|"), 3, "command message: bad argv"},
		{"envc past the message", z("1000|1000|0|0|/|/bin/true|1|true|3|A=b|"), 3, "command message: bad environment"},
		{"bytes after the environment", append(append([]byte(nil), good...), "extra"...), 3, "command message: 5 bytes after the environment"},
		{"unterminated last string", good[:len(good)-1], 3, "command message: bad environment"},
		{"longer than the helper reads", append(append([]byte(nil), good...), make([]byte, spareMaxSpec)...), 3, fmt.Sprintf("command message: longer than %d bytes", spareMaxSpec)},
		{"two descriptors", good, 2, "command descriptors: want 3 in one message"},
		{"no descriptors", good, 0, "command descriptors: want 3 in one message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runSpareHelper(t, "", tc.msg, tc.nfds)
			var he *helperError
			if !errors.As(r.status, &he) || !errors.Is(r.status, unix.EINVAL) {
				t.Fatalf("status %v (exit %d), want EINVAL", r.status, r.exit)
			}
			if want := tc.want + ": invalid argument"; he.Error() != want {
				t.Errorf("message %q, want %q", he.Error(), want)
			}
			if r.exit != 127 {
				t.Errorf("spare exit %d, want 127", r.exit)
			}
		})
	}
	t.Run("let go", func(t *testing.T) {
		r := runSpareHelper(t, "", nil, 3)
		if r.status != nil || r.exit != 0 {
			t.Errorf("a spare the agent let go: status %v, exit %d; want none and 0", r.status, r.exit)
		}
	})
}

// TestMain makes the test binary an agent binary for the helper's forms:
// the C helper runs before it (jobexec.c), MaybeJobExec refuses the calls
// the C helper did not take, as cmd/sandbox-agent's main does.
func TestMain(m *testing.M) {
	MaybeJobExec(os.Args)
	os.Exit(m.Run())
}

// A malformed call that misses the C helper's forms reaches Go and is
// refused there, not served as an agent.
func TestJobExecMalformedCallReachesGo(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := runHelper(t, []string{self, JobExecArg, "1000"}, nil)
	if !errors.Is(r.status, unix.EINVAL) || r.exit != 127 || !strings.Contains(fmt.Sprint(r.status), "job-exec helper: bad arguments") {
		t.Errorf("status %v, exit %d", r.status, r.exit)
	}
}
