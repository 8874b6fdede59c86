package qga

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// ExecRequest is one guest-exec.
type ExecRequest struct {
	// Path is the program (absolute on Linux, e.g. C:\Windows\System32\cmd.exe
	// on Windows); Args are its arguments.
	Path string
	Args []string
	Env  []string
	// Stdin is passed whole as input-data.
	Stdin []byte
	// Merged asks for stdout and stderr in one stream (Stdout): qemu-ga 8.1
	// or later (older agents, e.g. Debian 12's 7.2, take only a boolean and
	// the error says so). qemu-ga compiles this mode out on Windows: set
	// Windows and it is refused here with a clear error instead of the
	// agent's parse error.
	Merged  bool
	Windows bool
}

// ExecResult is the outcome of a finished guest-exec. qemu-ga keeps at most
// 16 MiB per stream (7.2) and says when it dropped the rest.
type ExecResult struct {
	PID      int
	ExitCode int
	// Signal is the terminating signal on Linux; on Windows qemu-ga reports
	// an unhandled exception code here.
	Signal          int
	Signaled        bool
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	Duration        time.Duration
}

// execStatus is guest-exec-status's reply.
type execStatus struct {
	Exited       bool   `json:"exited"`
	ExitCode     *int   `json:"exitcode"`
	Signal       *int   `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// pollMin and pollMax bound the back-off between guest-exec-status polls:
// short first (most commands finish in milliseconds), then capped so that a
// long command costs one round trip every pollMax.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 250 * time.Millisecond
)

// RunningError is Exec's error when ctx ended while the program still
// ran: PID is its process id in the guest (on Windows too: qemu-ga
// reports GetProcessId of its handle), for the caller to kill it with
// another guest-exec and collect what it wrote with Status.
type RunningError struct {
	PID int
	Err error
}

func (e *RunningError) Error() string { return e.Err.Error() }
func (e *RunningError) Unwrap() error { return e.Err }

// ended reports whether ctx is done or its deadline has passed: a call cut
// by the connection's deadline (set from ctx's) may return before ctx's own
// timer has fired.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Status returns the result of guest-exec pid if it has exited, or nil
// while it runs.
func (c *Client) Status(ctx context.Context, pid int) (*ExecResult, error) {
	var st execStatus
	if err := c.Call(ctx, "guest-exec-status", map[string]int{"pid": pid}, &st); err != nil {
		return nil, err
	}
	if !st.Exited {
		return nil, nil
	}
	return st.result(pid, 0)
}

// Exec starts a program with guest-exec, polls guest-exec-status until it
// exits and returns its result. When ctx ends first the error is a
// *RunningError; qemu-ga offers no way to kill the process, so the caller
// decides what to do with it (qemu-ga 7.2 has no guest-exec timeout
// argument).
func (c *Client) Exec(ctx context.Context, r ExecRequest) (*ExecResult, error) {
	if r.Path == "" {
		return nil, errdefs.Invalidf("path: required")
	}
	if r.Merged && r.Windows {
		return nil, errdefs.Invalidf("merged: qemu-ga on Windows cannot merge stdout and stderr; read them separately")
	}
	args := map[string]any{"path": r.Path, "capture-output": true}
	if r.Merged {
		args["capture-output"] = "merged"
	}
	if len(r.Args) > 0 {
		args["arg"] = r.Args
	}
	if len(r.Env) > 0 {
		args["env"] = r.Env
	}
	if len(r.Stdin) > 0 {
		args["input-data"] = base64.StdEncoding.EncodeToString(r.Stdin)
	}
	start := time.Now()
	var started struct {
		PID *int `json:"pid"`
	}
	if err := c.Call(ctx, "guest-exec", args, &started); err != nil {
		var qe *Error
		if r.Merged && errors.As(err, &qe) && strings.Contains(qe.Desc, "capture-output") {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "merged: this qemu-ga (older than 8.1) cannot merge stdout and stderr; read them separately")
		}
		return nil, err
	}
	if started.PID == nil {
		return nil, errdefs.Unavailablef("qga guest-exec: reply without pid")
	}
	pid := *started.PID
	wait := pollMin
	for {
		var st execStatus
		if err := c.Call(ctx, "guest-exec-status", map[string]int{"pid": pid}, &st); err != nil {
			if ended(ctx) {
				// The context ended during the poll rather than between
				// polls: the program still runs all the same.
				return nil, &RunningError{PID: pid, Err: errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "qga: pid %d still running", pid)}
			}
			var qe *Error
			if errors.As(err, &qe) {
				// The agent forgot the pid: restarted, or restored from a
				// snapshot taken before the exec.
				return nil, errdefs.Wrap(errdefs.Unavailable, err, "qga: lost track of pid %d", pid)
			}
			return nil, err
		}
		if st.Exited {
			return st.result(pid, time.Since(start))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &RunningError{PID: pid, Err: errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "qga: pid %d still running", pid)}
		case <-t.C:
		}
		wait = min(wait*2, pollMax)
	}
}

func (st *execStatus) result(pid int, d time.Duration) (*ExecResult, error) {
	res := &ExecResult{PID: pid, StdoutTruncated: st.OutTruncated, StderrTruncated: st.ErrTruncated, Duration: d}
	switch {
	case st.ExitCode != nil:
		res.ExitCode = *st.ExitCode
	case st.Signal != nil:
		res.Signaled = true
		res.Signal = *st.Signal
		res.ExitCode = 128 + *st.Signal
	default:
		return nil, errdefs.Unavailablef("qga guest-exec-status: pid %d exited without exit code or signal", pid)
	}
	var err error
	if res.Stdout, err = b64(st.OutData); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "qga guest-exec-status: out-data")
	}
	if res.Stderr, err = b64(st.ErrData); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "qga guest-exec-status: err-data")
	}
	return res, nil
}

// String summarises a result for logs.
func (r *ExecResult) String() string {
	return fmt.Sprintf("pid %d exit %d (%d+%d bytes)", r.PID, r.ExitCode, len(r.Stdout), len(r.Stderr))
}
