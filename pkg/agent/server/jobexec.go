package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// JobExecArg is the first argument that makes the agent binary act as the
// job-exec helper (see jobcgroup.go) instead of serving.
const JobExecArg = "__job-exec"

// helperArgv is the helper's argv for a command: the credentials to take,
// whether it keeps the capabilities (see jobCreds), its working directory,
// the cgroup.procs files to enter, then the command's own path and argv.
//
//	agent __job-exec <uid> <gid> <keep|drop> <dir> <procs,...> <path> <argv...>
func helperArgv(self string, c jobCreds, dir string, procs []string, path string, argv []string) []string {
	caps := "drop"
	if c.keepCaps {
		caps = "keep"
	}
	out := []string{self, JobExecArg, strconv.Itoa(c.uid), strconv.Itoa(c.gid), caps, dir, strings.Join(procs, ","), path}
	return append(out, argv...)
}

// jobCreds is who a job runs as.
type jobCreds struct {
	uid, gid int
	// keepCaps keeps the capability bounding set the sandbox gave the
	// agent: only for a root-mode sandbox's jobs as uid 0, which are to
	// have root mode's capabilities (pkg/runtime.RootModeCapabilities).
	// Every other job loses its bounding and ambient sets before it
	// switches credentials, so it has no capability at all and can never
	// gain one.
	keepCaps bool
}

// helperStatusFD is the helper's descriptor of a close-on-exec pipe to the
// agent: closed unread when the command's exec succeeds, else it carries
// "<errno> <message>" (as Go's own ForkExec reports exec failures).
const helperStatusFD = 3

// MaybeJobExec runs the job-exec helper when args (os.Args) ask for it, and
// never returns then: it places itself in the job's cgroups, drops to the
// command's credentials and executes the command — at once, or as a spare
// (spare.go) once the agent sends it a command.
func MaybeJobExec(args []string) {
	if len(args) == 3 && args[1] == SpareArg {
		runSpare(args[2])
	}
	if len(args) < 9 || args[1] != JobExecArg {
		return
	}
	lockMainThread()
	status := os.NewFile(helperStatusFD, "status")
	unix.CloseOnExec(helperStatusFD)
	fail := func(errno syscall.Errno, format string, a ...any) {
		fmt.Fprintf(status, "%d %s", int(errno), fmt.Sprintf(format, a...))
		os.Exit(127)
	}
	uid, err1 := strconv.Atoi(args[2])
	gid, err2 := strconv.Atoi(args[3])
	if err1 != nil || err2 != nil || (args[4] != "keep" && args[4] != "drop") {
		fail(syscall.EINVAL, "bad credentials %q %q %q", args[2], args[3], args[4])
	}
	creds := jobCreds{uid: uid, gid: gid, keepCaps: args[4] == "keep"}
	if args[6] != "" {
		for _, f := range strings.Split(args[6], ",") {
			// "0" is the writing process: the whole thread group moves.
			if err := os.WriteFile(f, []byte("0"), 0); err != nil {
				fail(errnoOf(err), "enter job cgroup: %v", err)
			}
		}
	}
	becomeAndExec(creds, args[5], args[7], args[8:], os.Environ(), fail)
}

// lockMainThread wires the helper's goroutine to the thread it runs on
// before anything can move it: the thread that drops the capabilities and
// the credentials must be the one that execs (becomeAndExec). Done while
// main still runs on the process's first thread, it also spares the Go
// runtime the extra thread it starts when a goroutine locks another one
// (each thread is one more for execve to end: traced at 0.05–0.1 ms).
func lockMainThread() { runtime.LockOSThread() }

// becomeAndExec drops to the job's credentials, enters dir and executes
// path; fail reports what went wrong and does not return.
//
// Security boundary: after it, a job that does not keep the capabilities
// has none — empty permitted, effective, inheritable, ambient and bounding
// sets — and no_new_privs (inherited from PID 1) keeps setuid binaries and
// file capabilities from giving any back.
func becomeAndExec(c jobCreds, dir, path string, argv, env []string, fail func(syscall.Errno, string, ...any)) {
	// Make the OOM killer pick the command rather than the agent; raising
	// one's own score needs no privilege, and the file is still ours here
	// (after the switch it would be the job's and the agent's write would
	// need CAP_DAC_OVERRIDE). Failure only costs that preference.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte(oomScoreAdj), 0)
	// The bounding and ambient sets are per thread and execve passes on the
	// calling thread's: drop them on the thread that execs. (The callers
	// locked it already, first thing; this keeps the function safe alone.)
	runtime.LockOSThread()
	if !c.keepCaps {
		if err := dropBoundingSet(); err != nil {
			fail(errnoOf(err), "%v", err)
		}
	}
	// Switching to a non-zero uid clears the permitted and effective sets;
	// supplementary groups are reset to the command's gid.
	if err := setCredsThisThread(c); err != nil {
		fail(errnoOf(err), "%v", err)
	}
	// With the job's credentials, so a directory only the job's user may
	// enter works and one it may not fails, whatever the agent may.
	if err := unix.Chdir(dir); err != nil {
		fail(errnoOf(err), "chdir %s: %v", dir, err)
	}
	err := unix.Exec(path, argv, env)
	fail(errnoOf(err), "%v", err)
}

// setCredsThisThread switches the calling thread's supplementary groups,
// gid and uid (real, effective and saved) to c's, and no other thread's.
//
// Security boundary: that is enough because the thread execs next, with
// nothing run in between but this package's code: execve gives the new
// image the calling thread's credentials and ends every other thread of
// the process before the image runs (de_thread), and any failure on the
// way exits. The other threads only ever run the Go runtime. Go's own
// Setgroups, Setgid and Setuid switch every thread instead, each by a
// signal to every thread and a wait for its answer: 0.3 ms of an exec of
// `true` on the 2-core test host (traced), for threads about to die.
func setCredsThisThread(c jobCreds) error {
	gid := uint32(c.gid)
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 1, uintptr(unsafe.Pointer(&gid)), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(c.gid), uintptr(c.gid), uintptr(c.gid)); e != 0 {
		return fmt.Errorf("setgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(c.uid), uintptr(c.uid), uintptr(c.uid)); e != 0 {
		return fmt.Errorf("setuid: %w", e)
	}
	return nil
}

// oomScoreAdj is every job's /proc/PID/oom_score_adj.
const oomScoreAdj = "500"

// dropBoundingSet empties the calling thread's capability bounding set and
// its ambient set. PR_CAPBSET_DROP needs CAP_SETPCAP, which the agent holds
// for this (pkg/runtime.AgentCapabilities); it answers EINVAL past the
// kernel's last capability.
func dropBoundingSet() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL && c > 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EINVAL
}

// helperStatus reads the helper's report: nil once the command runs.
func helperStatus(r *os.File) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read job-exec status: %w", err)
	}
	if len(b) == 0 {
		return nil
	}
	num, msg, _ := strings.Cut(string(b), " ")
	n, err := strconv.Atoi(num)
	if err != nil {
		return fmt.Errorf("job-exec helper: %s", b)
	}
	return &helperError{errno: syscall.Errno(n), msg: msg}
}

// helperError is a failure the helper reported; it unwraps to the errno so
// execError classifies it like a direct exec failure.
type helperError struct {
	errno syscall.Errno
	msg   string
}

func (e *helperError) Error() string { return e.msg }
func (e *helperError) Unwrap() error { return e.errno }
