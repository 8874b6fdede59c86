package engine

import (
	"bytes"
	"context"
	"io"
	"path"
	rtrace "runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// ExecRequest is the input of exec_command.
type ExecRequest = apitypes.ExecRequest

const maxStdin = apitypes.MaxStdin

// Exec runs a command in a sandbox and waits for it. onOutput, if not nil,
// receives output as it arrives.
func (e *Engine) Exec(ctx context.Context, req ExecRequest, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	defer rtrace.StartRegion(ctx, "engine.exec").End()
	ctx, span := telemetry.StartOp(ctx, "sandbox.exec", telemetry.Sandbox(req.SandboxID))
	reg := rtrace.StartRegion(ctx, "exec.spec")
	spec, err := e.execSpecFor(ctx, req)
	reg.End()
	if err != nil {
		return nil, telemetry.End(span, err)
	}
	res, err := e.sandboxes.Exec(ctx, req.SandboxID, *spec, onOutput)
	if err == nil {
		e.metrics.execTime.Observe(float64(res.DurationMS) / 1000)
		e.metrics.causes.WithLabelValues(res.Termination.Cause).Inc()
		span.SetAttributes(telemetry.KeyExitCode.Int(res.ExitCode))
	}
	return res, telemetry.End(span, err)
}

// StartJob runs a command in the background (exec_command with background:
// true) and returns its job id at once.
func (e *Engine) StartJob(ctx context.Context, req ExecRequest) (string, error) {
	spec, err := e.execSpec(req)
	if err != nil {
		return "", err
	}
	return e.sandboxes.StartJob(ctx, req.SandboxID, *spec)
}

// JobStatusRequest is the input of job_status.
type JobStatusRequest = apitypes.JobStatusRequest

// JobStatus pages a job's output from the given offsets and reports its
// outcome once it has finished.
func (e *Engine) JobStatus(ctx context.Context, req JobStatusRequest) (*sandbox.JobStatus, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := checkJobID(req.JobID); err != nil {
		return nil, err
	}
	if req.StdoutOffset < 0 || req.StderrOffset < 0 {
		return nil, errdefs.Invalidf("stdout_offset/stderr_offset: must not be negative")
	}
	max := req.MaxBytes
	switch {
	case max < 0:
		return nil, errdefs.Invalidf("max_bytes: must not be negative")
	case max == 0:
		max = 64 << 10
	case max > 16<<20:
		return nil, errdefs.Invalidf("max_bytes: exceeds the maximum %d", 16<<20)
	}
	st, err := e.sandboxes.JobStatus(ctx, req.SandboxID, req.JobID, req.StdoutOffset, req.StderrOffset, max)
	if err != nil {
		return nil, err
	}
	pageJobOutput(st, max)
	return st, nil
}

// DefaultKillSignal is what job_kill sends when no signal is given.
const DefaultKillSignal = "SIGKILL"

// killWait is how long KillJob waits for a signalled job to end, so that its
// answer can say finished.
const killWait = 2 * time.Second

// KillJob signals a job's process group (default SIGKILL) and waits briefly
// for it to end; the result says the job's state after the wait.
func (e *Engine) KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := checkJobID(req.JobID); err != nil {
		return nil, err
	}
	sig := req.Signal
	if sig == "" {
		sig = DefaultKillSignal
	}
	if !validSignal(sig) {
		return nil, errdefs.Invalidf("signal: unknown signal %q (use e.g. SIGTERM, SIGKILL, SIGINT)", sig)
	}
	if err := e.sandboxes.KillJob(ctx, req.SandboxID, req.JobID, sig); err != nil {
		return nil, err
	}
	out := &apitypes.JobKillResult{JobID: req.JobID, Signal: sig, State: "running"}
	for deadline := time.Now().Add(killWait); ; {
		st, err := e.sandboxes.JobStatus(ctx, req.SandboxID, req.JobID, 0, 0, 1)
		if err != nil {
			return nil, err
		}
		if out.State = st.State; st.State != "running" || time.Now().After(deadline) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func validSignal(s string) bool {
	switch strings.TrimPrefix(strings.ToUpper(s), "SIG") {
	case "HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM", "CONT", "STOP", "TSTP", "ALRM":
		return true
	}
	return false
}

func checkJobID(id string) error {
	if id == "" {
		return errdefs.Invalidf("job_id: required")
	}
	if len(id) > 64 || strings.ContainsAny(id, "/\x00 ") {
		return errdefs.Invalidf("job_id: malformed %q", id)
	}
	return nil
}

// TerminalRequest opens an interactive command on a pseudo-terminal.
type TerminalRequest = apitypes.TerminalRequest

// OpenTerminal starts an interactive command (default: a login-less bash) on
// a new pseudo-terminal in a sandbox.
func (e *Engine) OpenTerminal(ctx context.Context, req TerminalRequest) (*sandbox.Terminal, error) {
	if req.Command == "" && len(req.Argv) == 0 {
		req.Argv = []string{"/bin/bash", "-i"}
	}
	spec, err := e.execSpec(ExecRequest{SandboxID: req.SandboxID, Command: req.Command, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd})
	if err != nil {
		return nil, err
	}
	rows, cols := req.Rows, req.Cols
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	return e.sandboxes.OpenTerminal(ctx, req.SandboxID, sandbox.TerminalSpec{Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd, Rows: rows, Cols: cols})
}

// OpenProcess starts a command its caller follows itself (the E2B front
// end): on a pseudo-terminal or on pipes with stdin open, as the sandbox user
// or as root.
func (e *Engine) OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (*sandbox.Terminal, error) {
	spec, err := e.execSpec(ExecRequest{SandboxID: req.SandboxID, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd})
	if err != nil {
		return nil, err
	}
	ts := sandbox.TerminalSpec{Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd, Rows: req.Rows, Cols: req.Cols, Pipes: !req.TTY}
	if req.TTY && (ts.Rows == 0 || ts.Cols == 0) {
		return nil, errdefs.Invalidf("rows/cols: a terminal needs a size, got %dx%d", req.Rows, req.Cols)
	}
	if req.TimeoutSeconds != 0 {
		if ts.Timeout, err = duration("timeout_seconds", req.TimeoutSeconds, 0); err != nil {
			return nil, err
		}
	}
	if req.Root {
		root := 0
		ts.UID = &root
	}
	return e.sandboxes.OpenTerminal(ctx, req.SandboxID, ts)
}

// AttachProcess follows a command OpenProcess started, from the given
// output offsets, once the session that started it is gone (the E2B front
// end after a daemon restart).
func (e *Engine) AttachProcess(ctx context.Context, sandboxID, jobID string, stdoutOff, stderrOff int64) (*sandbox.Terminal, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return nil, err
	}
	if err := checkJobID(jobID); err != nil {
		return nil, err
	}
	if stdoutOff < 0 || stderrOff < 0 {
		return nil, errdefs.Invalidf("stdout_offset/stderr_offset: must not be negative")
	}
	return e.sandboxes.AttachTerminal(ctx, sandboxID, jobID, stdoutOff, stderrOff)
}

// ListJobs lists the commands a sandbox's agent knows about.
func (e *Engine) ListJobs(ctx context.Context, id string) ([]apitypes.JobInfo, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	jobs, err := e.sandboxes.Jobs(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]apitypes.JobInfo, len(jobs))
	for i, j := range jobs {
		out[i] = apitypes.JobInfo{ID: j.ID, Argv: j.Argv, PID: j.PID, State: j.State, TTY: j.TTY,
			StartedAt: j.StartedAt, StdoutBytes: j.StdoutBytes, StderrBytes: j.StderrBytes}
		if x := j.Exit; x != nil {
			out[i].Exit = &apitypes.JobExit{Cause: x.Cause, ExitCode: x.ExitCode, Signal: x.Signal, Detail: x.Detail,
				StartedAt: x.StartedAt, FinishedAt: x.FinishedAt, DurationMS: x.DurationMS,
				StdoutBytes: x.StdoutBytes, StderrBytes: x.StderrBytes}
		}
	}
	return out, nil
}

// execSpecFor is execSpec for a command of sandbox req.SandboxID, whose
// working directory, on a guest reached through its own guest agent, is a
// path of the guest's OS, checked by the guest's handle.
func (e *Engine) execSpecFor(ctx context.Context, req ExecRequest) (*sandbox.ExecSpec, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if req.Cwd != "" {
		if guest, err := e.sandboxes.GuestCheckPath(ctx, req.SandboxID, "cwd", req.Cwd); guest {
			if err != nil {
				return nil, err
			}
			cwd := req.Cwd
			req.Cwd = ""
			spec, err := e.execSpec(req)
			if spec != nil {
				spec.Cwd = cwd
			}
			return spec, err
		}
	}
	return e.execSpec(req)
}

func (e *Engine) execSpec(req ExecRequest) (*sandbox.ExecSpec, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	var argv []string
	switch {
	case req.Command != "" && len(req.Argv) > 0:
		return nil, errdefs.Invalidf("command: give either command or argv, not both")
	case req.Command != "":
		if strings.ContainsRune(req.Command, 0) {
			return nil, errdefs.Invalidf("command: contains a NUL byte")
		}
		argv = []string{"/bin/sh", "-c", req.Command}
	case len(req.Argv) > 0:
		if req.Argv[0] == "" {
			return nil, errdefs.Invalidf("argv[0]: empty program name")
		}
		if err := checkArgs("argv", req.Argv); err != nil {
			return nil, err
		}
		argv = req.Argv
	default:
		return nil, errdefs.Invalidf("command: required (or a non-empty argv)")
	}
	sc := e.cfg.Sandbox
	spec := &sandbox.ExecSpec{Argv: argv, Command: req.Command, Env: req.Env, Timeout: sc.ExecTimeout.D(), MaxResultBytes: req.MaxOutputBytes}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return nil, err
		}
		spec.Cwd = req.Cwd
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	if err := checkArgvSize(argv, req.Env); err != nil {
		return nil, err
	}
	if len(req.Stdin) > maxStdin {
		return nil, errdefs.Invalidf("stdin: %d bytes exceeds the maximum %d", len(req.Stdin), maxStdin)
	}
	if req.Stdin != "" {
		spec.Stdin = []byte(req.Stdin)
	}
	if req.TimeoutSeconds != nil {
		d, err := duration("timeout_seconds", *req.TimeoutSeconds, sc.MaxExecTimeout.D())
		if err != nil {
			return nil, err
		}
		spec.Timeout = d
	}
	return spec, nil
}

// The kernel's limits on what execve takes: MAX_ARG_STRLEN per string, and
// a total well under the usual ARG_MAX (a quarter of the 8 MiB stack)
// that leaves room for the image's environment.
const (
	maxArgBytes  = 128 << 10
	maxArgvBytes = 1 << 20
)

// checkArgvSize refuses an argv or environment execve would refuse (E2BIG),
// naming the field, before anything starts.
func checkArgvSize(argv []string, env map[string]string) error {
	total := 0
	for i, a := range argv {
		if len(a) >= maxArgBytes {
			return errdefs.Invalidf("argv[%d]: %d bytes exceeds the kernel's %d per argument", i, len(a), maxArgBytes)
		}
		total += len(a) + 1
	}
	for k, v := range env {
		if len(k)+len(v)+1 >= maxArgBytes {
			return errdefs.Invalidf("env.%s: %d bytes exceeds the kernel's %d per variable", k, len(k)+len(v)+1, maxArgBytes)
		}
		total += len(k) + len(v) + 2
	}
	if total > maxArgvBytes {
		return errdefs.Invalidf("argv: argv and env take %d bytes, more than the %d a command may get", total, maxArgvBytes)
	}
	return nil
}

// checkSandboxPath checks path p of sandbox id: a path of the guest's OS,
// checked by its handle, on a guest reached through its own guest agent
// (C:\... on Windows; absolute, with no working directory to resolve a
// relative one against); else checkPath.
func (e *Engine) checkSandboxPath(ctx context.Context, id, field, p string) error {
	if guest, err := e.sandboxes.GuestCheckPath(ctx, id, field, p); guest {
		return err
	}
	return checkPath(field, p)
}

// checkPath validates a path inside a sandbox: absolute, clean of NULs and
// within the length limits. ".." components are resolved lexically here and
// again, against the sandbox's own root, by the agent.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return errdefs.Invalidf("%s: required", field)
	case strings.ContainsRune(p, 0):
		return errdefs.Invalidf("%s: contains a NUL byte", field)
	case !strings.HasPrefix(p, "/"):
		return errdefs.Invalidf("%s: must be an absolute path, got %q", field, p)
	case len(p) > 4096:
		return errdefs.Invalidf("%s: longer than 4096 bytes", field)
	}
	return nil
}

// FileWriteRequest is the input of file_write.
type FileWriteRequest = apitypes.FileWriteRequest

// FileResult is the outcome of file_write and file_delete.
type FileResult = apitypes.FileResult

// MaxFileBytes is the largest single file transfer.
const MaxFileBytes = 256 << 20

// WriteFile writes a file in a sandbox.
func (e *Engine) WriteFile(ctx context.Context, req FileWriteRequest) (*FileResult, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := e.checkSandboxPath(ctx, req.SandboxID, "path", req.Path); err != nil {
		return nil, err
	}
	data, err := decodeContent(req.Encoding, req.Content)
	if err != nil {
		return nil, err
	}
	return e.WriteFileFrom(ctx, req.SandboxID, req.Path, req.Mode, req.Append, int64(len(data)), bytes.NewReader(data))
}

// WriteFileFrom writes size bytes from r to path in a sandbox (uploads).
// mode is octal text ("0755"); empty keeps an existing file's mode and gives
// a new one 0644.
func (e *Engine) WriteFileFrom(ctx context.Context, id, p, modeText string, appendTo bool, size int64, r io.Reader) (*FileResult, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if err := e.checkSandboxPath(ctx, id, "path", p); err != nil {
		return nil, err
	}
	mode, err := parseMode(modeText)
	if err != nil {
		return nil, err
	}
	if size > MaxFileBytes {
		return nil, errdefs.Invalidf("content: %d bytes exceeds the maximum %d", size, MaxFileBytes)
	}
	fi, err := e.sandboxes.WriteFile(ctx, id, agent.WriteFileRequest{Path: p, Mode: mode, Append: appendTo, Size: size, MkdirParents: true}, r)
	if err != nil {
		return nil, err
	}
	return &FileResult{Path: fi.Path, Size: fi.Size}, nil
}

// parseMode parses octal permission bits; "" is 0, the agent's "keep or 0644".
// Setuid and setgid are refused: nothing in a sandbox may gain privileges.
func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	switch {
	case err != nil || m > 0o7777:
		return 0, errdefs.Invalidf("mode: must be octal permission bits like \"0644\", got %q", s)
	case m&0o6000 != 0:
		return 0, errdefs.Invalidf("mode: setuid and setgid bits are not allowed, got %q", s)
	}
	return uint32(m), nil
}

// FileReadRequest is the input of file_read.
type FileReadRequest = apitypes.FileReadRequest

// FileReadResult is the outcome of file_read.
type FileReadResult = apitypes.FileReadResult

// DefaultReadBytes is file_read's default max_bytes.
const DefaultReadBytes = 1 << 20

// ReadFile reads (part of) a file in a sandbox. Content that is not valid
// UTF-8 comes back base64-encoded whatever the requested encoding, and says so.
func (e *Engine) ReadFile(ctx context.Context, req FileReadRequest) (*FileReadResult, error) {
	raw, err := e.ReadFileRaw(ctx, req)
	if err != nil {
		return nil, err
	}
	return apitypes.NewFileReadResult(req, raw.Path, raw.Size, raw.Truncated, raw.Data), nil
}

// ReadFileRaw reads (part of) a file in a sandbox as bytes (downloads).
func (e *Engine) ReadFileRaw(ctx context.Context, req FileReadRequest) (*agent.FileData, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := e.checkSandboxPath(ctx, req.SandboxID, "path", req.Path); err != nil {
		return nil, err
	}
	if err := apitypes.CheckReadEncoding(req.Encoding); err != nil {
		return nil, err
	}
	max, err := readWindow(req.Offset, req.MaxBytes)
	if err != nil {
		return nil, err
	}
	return e.sandboxes.ReadFile(ctx, req.SandboxID, req.Path, req.Offset, max)
}

// FileEntry is one file_list entry.
type FileEntry = apitypes.FileEntry

// ListFiles lists a directory in a sandbox (default /workspace).
func (e *Engine) ListFiles(ctx context.Context, id, p string, recursive bool) ([]FileEntry, error) {
	p, err := e.listPath(ctx, id, p)
	if err != nil {
		return nil, err
	}
	list, err := e.sandboxes.ListFiles(ctx, id, p, recursive)
	if err != nil {
		return nil, err
	}
	out := make([]FileEntry, len(list))
	for i, f := range list {
		out[i] = FileEntry{Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode, MTime: f.MTime}
	}
	return out, nil
}

// listPath checks a listing's sandbox id and directory (empty:
// /workspace) and returns the directory, cleaned.
func (e *Engine) listPath(ctx context.Context, id, p string) (string, error) {
	if err := checkSandboxID(id); err != nil {
		return "", err
	}
	if p == "" {
		p = "/workspace"
	}
	if err := e.checkSandboxPath(ctx, id, "path", p); err != nil {
		return "", err
	}
	return path.Clean(p), nil
}

// DeleteFile deletes a file (or, with recursive, a directory tree) in a sandbox.
func (e *Engine) DeleteFile(ctx context.Context, id, p string, recursive bool) (*FileResult, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if path.Clean(p) == "/" {
		return nil, errdefs.Invalidf("path: refusing to delete /")
	}
	if err := e.sandboxes.DeleteFile(ctx, id, p, recursive); err != nil {
		return nil, err
	}
	return &FileResult{Path: p}, nil
}

// decodeContent is a file write's content in its encoding (utf-8, the
// default, or base64).
func decodeContent(encoding, content string) ([]byte, error) {
	return apitypes.DecodeFileContent(encoding, content)
}

// readWindow checks a file read's offset and size, and returns the size
// to read (max_bytes 0 is DefaultReadBytes).
func readWindow(offset, max int64) (int64, error) {
	if offset < 0 {
		return 0, errdefs.Invalidf("offset: must not be negative")
	}
	switch {
	case max < 0:
		return 0, errdefs.Invalidf("max_bytes: must not be negative")
	case max == 0:
		return DefaultReadBytes, nil
	case max > MaxFileBytes:
		return 0, errdefs.Invalidf("max_bytes: exceeds the maximum %d", MaxFileBytes)
	}
	return max, nil
}
