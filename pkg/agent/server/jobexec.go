package server

import (
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
// "<errno> <context>" (as Go's own ForkExec reports exec failures, with
// the failing step's context added).
const helperStatusFD = 3

// MaybeJobExec ends the process when args (os.Args) ask for the job-exec
// helper but reached Go: the C helper (jobexec.c) takes every well-formed
// call before the runtime starts, so what is left is malformed. It reports
// that on the helper's descriptor and exits 127; it returns otherwise.
func MaybeJobExec(args []string) {
	if len(args) < 2 || (args[1] != JobExecArg && args[1] != SpareArg) {
		return
	}
	_, _ = unix.Write(helperStatusFD, []byte(strconv.Itoa(int(syscall.EINVAL))+" job-exec helper: bad arguments"))
	os.Exit(127)
}

// oomScoreAdj is every job's /proc/PID/oom_score_adj (JOBEXEC_OOM_SCORE_ADJ
// in jobexec.h, which the helper writes itself).
const oomScoreAdj = "500"

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
	// The helper sends the context of a failure, the errno's text is
	// added here (as Go's errors read): "chdir /x: no such file or
	// directory", or the text alone for a failed execve.
	if msg == "" {
		msg = syscall.Errno(n).Error()
	} else {
		msg += ": " + syscall.Errno(n).Error()
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
