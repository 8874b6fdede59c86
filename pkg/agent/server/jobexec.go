package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// JobExecArg is the first argument that makes the agent binary act as the
// job-exec helper (see jobcgroup.go) instead of serving.
const JobExecArg = "__job-exec"

// helperArgv is the helper's argv for a command: the cgroup.procs files to
// enter, the credentials to take, then the command's own path and argv.
//
//	agent __job-exec <uid> <gid> <procs,...> <path> <argv...>
func helperArgv(self string, procs []string, uid, gid int, path string, argv []string) []string {
	out := []string{self, JobExecArg, strconv.Itoa(uid), strconv.Itoa(gid), strings.Join(procs, ","), path}
	return append(out, argv...)
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
	if len(args) < 7 || args[1] != JobExecArg {
		return
	}
	status := os.NewFile(helperStatusFD, "status")
	unix.CloseOnExec(helperStatusFD)
	fail := func(errno syscall.Errno, format string, a ...any) {
		fmt.Fprintf(status, "%d %s", int(errno), fmt.Sprintf(format, a...))
		os.Exit(127)
	}
	uid, err1 := strconv.Atoi(args[2])
	gid, err2 := strconv.Atoi(args[3])
	if err1 != nil || err2 != nil {
		fail(syscall.EINVAL, "bad credentials %q %q", args[2], args[3])
	}
	if args[4] != "" {
		for _, f := range strings.Split(args[4], ",") {
			// "0" is the writing process: the whole thread group moves.
			if err := os.WriteFile(f, []byte("0"), 0); err != nil {
				fail(errnoOf(err), "enter job cgroup: %v", err)
			}
		}
	}
	becomeAndExec(uid, gid, args[5], args[6:], os.Environ(), fail)
}

// becomeAndExec drops to uid/gid and executes path; fail reports what went
// wrong and does not return.
func becomeAndExec(uid, gid int, path string, argv, env []string, fail func(syscall.Errno, string, ...any)) {
	// Go applies these to every thread. Switching to a non-zero uid clears
	// every capability; supplementary groups are reset to the command's gid.
	if err := syscall.Setgroups([]int{gid}); err != nil {
		fail(errnoOf(err), "setgroups: %v", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		fail(errnoOf(err), "setgid: %v", err)
	}
	if err := syscall.Setuid(uid); err != nil {
		fail(errnoOf(err), "setuid: %v", err)
	}
	err := unix.Exec(path, argv, env)
	fail(errnoOf(err), "%v", err)
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
