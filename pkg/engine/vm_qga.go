package engine

// VMs whose guest runs only the QEMU guest agent: an administrator's disk
// (vm.images.windows, vm.images.linux) has no sandbox-agent, so vm_exec,
// vm_file_write and vm_file_read reach it through qemu-ga (pkg/vm/qga)
// instead of the sandbox operations. The sandbox manager still runs the
// VM's lifecycle: each call here is a command of the sandbox
// (sandbox.Manager.RunCommand), so it is running meanwhile and the idle
// timeout counts it.
//
// Security boundary: qemu-ga runs as root on Linux and as LocalSystem on
// Windows, so a command or file operation here has the guest's highest
// privilege. The guest itself is the boundary (QEMU's seccomp, -runas, the
// cgroup, no network: pkg/vm); nothing the guest answers is trusted
// (pkg/vm/qga), and output is capped by the output limit.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// qgaLinuxPath is the PATH of commands in a Linux QGA guest: guest-exec
// with an environment replaces qemu-ga's whole environment.
const qgaLinuxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// qgaKillWait bounds the kill of a timed-out command and the collection
// of what it wrote.
const qgaKillWait = 10 * time.Second

// qgaExec runs a vm_exec on a QGA guest: command through the guest's shell
// (qga.ShellCommand: /bin/sh -c, or cmd.exe on Windows) or argv as is,
// stdin as guest-exec input, env, and the timeout enforced from here (see
// qgaKill). guest-exec has no working directory: with cwd a shell changes
// to it first (qgaCommand); without, commands start in qemu-ga's (/ on
// Linux, C:\Windows\System32 on Windows).
func (e *Engine) qgaExec(ctx context.Context, r *vmRef, req apitypes.VMExecRequest, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	spec, err := e.execSpec(req.ExecRequest()) // the checks and timeout of exec_command
	if err != nil {
		return nil, err
	}
	osName := r.qgaOS
	x, err := qgaCommand(osName, req, r.info.Env)
	if err != nil {
		return nil, err
	}
	x.Stdin = spec.Stdin
	limit := spec.MaxResultBytes
	if limit <= 0 || limit > int64(e.cfg.Sandbox.OutputLimit) {
		limit = int64(e.cfg.Sandbox.OutputLimit)
	}
	var res *sandbox.ExecResult
	err = e.sandboxes.RunCommand(ctx, r.info.ID, func(sandbox.Handle) error {
		c, err := r.v.QGA(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		xctx, cancel := ctx, context.CancelFunc(func() {})
		if spec.Timeout > 0 {
			xctx, cancel = context.WithTimeout(ctx, spec.Timeout)
		}
		out, err := c.Exec(xctx, x)
		cancel()
		var running *qga.RunningError
		switch {
		case err == nil:
			res = qgaResult(osName, out, limit, time.Since(start))
			return nil
		case errors.As(err, &running) && ctx.Err() == nil:
			// The timeout: kill it and report what it wrote.
			killed := e.qgaKill(ctx, c, osName, running.PID)
			res = qgaResult(osName, killed.res, limit, time.Since(start))
			res.ExitCode = -1
			res.Termination = sandbox.Termination{Cause: sandbox.CauseTimeout,
				Detail: fmt.Sprintf("killed after the %s timeout (%s)", spec.Timeout, killed.detail)}
			return nil
		case errors.As(err, &running):
			e.qgaKill(ctx, c, osName, running.PID)
			return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "command cancelled")
		default:
			var qe *qga.Error
			if errors.As(err, &qe) {
				// qemu-ga refused it: a program that does not exist, a
				// disabled guest-exec.
				return errdefs.Wrap(errdefs.InvalidArgument, err, "argv: the guest agent could not run %s: %s", x.Path, qe.Desc)
			}
			return err
		}
	})
	if err != nil {
		return nil, err
	}
	if onOutput != nil {
		// qemu-ga returns the output at the end, not as it comes.
		for _, o := range []struct{ stream, data string }{{"stdout", res.Stdout}, {"stderr", res.Stderr}} {
			if o.data != "" {
				onOutput(o.stream, []byte(o.data))
			}
		}
	}
	e.metrics.execTime.Observe(float64(res.DurationMS) / 1000)
	e.metrics.causes.WithLabelValues(res.Termination.Cause).Inc()
	return res, nil
}

// qgaCommand is the guest-exec of a vm_exec request (checked by execSpec)
// on a QGA guest of osName whose VM has the environment vmEnv.
func qgaCommand(osName string, req apitypes.VMExecRequest, vmEnv map[string]string) (qga.ExecRequest, error) {
	if req.Cwd != "" {
		if err := qga.CheckPath(osName, req.Cwd); err != nil {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: %s", strings.TrimPrefix(errdefs.MessageOf(err), "path: "))
		}
		if osName == vm.OSWindows && req.Command == "" {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: a Windows guest takes cwd with command, not argv (guest-exec has no working directory; cmd.exe changes to it)")
		}
		if osName == vm.OSWindows && strings.ContainsAny(req.Cwd, "\"%\r\n") {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: a Windows guest's directory must not contain \", %% or line breaks")
		}
	}
	env := sandbox.MergeEnv(vmEnv, req.Env)
	x := qga.ExecRequest{Windows: osName == vm.OSWindows}
	var err error
	switch {
	case req.Command != "" && osName == vm.OSWindows:
		// cmd.exe's set: guest-exec's env would replace the whole
		// environment, which Windows programs need (SystemRoot, PATH).
		// The working directory by cd, which ends the command when it
		// fails ("a || b & c" is "(a || b) & c" in cmd.exe).
		var pre strings.Builder
		if req.Cwd != "" {
			fmt.Fprintf(&pre, "cd /d \"%s\" || exit %d & ", req.Cwd, qgaCwdExit)
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			if err := checkWindowsEnv(k, v); err != nil {
				return x, err
			}
			fmt.Fprintf(&pre, "set \"%s=%s\" & ", k, v)
		}
		x.Path, x.Args, err = qga.ShellCommand(osName, pre.String()+req.Command)
	case osName == vm.OSWindows:
		if len(env) > 0 {
			return x, errdefs.Invalidf("env: a Windows guest takes environment variables with command, not argv (qemu-ga would replace the whole environment)")
		}
		x.Path, x.Args = req.Argv[0], req.Argv[1:]
	case req.Command != "":
		x.Path, x.Args, err = qga.ShellCommand(osName, req.Command)
	default:
		x.Path, x.Args = req.Argv[0], req.Argv[1:]
	}
	if osName != vm.OSWindows {
		x.Env = append([]string{"PATH=" + qgaLinuxPath, "LANG=C.UTF-8", "HOME=/root"}, env...)
		if req.Cwd != "" && err == nil {
			// guest-exec has no working directory: a shell changes to
			// it and execs the command (argv or the command's shell) in
			// place, so the exit status and signals are the command's.
			x.Args = append([]string{"-c", `cd -- "$1" || exit ` + fmt.Sprint(qgaCwdExit) + `; shift; exec "$@"`, "sh", req.Cwd, x.Path}, x.Args...)
			x.Path = "/bin/sh"
		}
	}
	return x, err
}

// qgaCwdExit is the exit status of a command on a QGA guest whose working
// directory could not be entered (the shell's own message on stderr says
// why), as env(1) and chroot(1) answer 125 when they fail themselves.
const qgaCwdExit = 125

// checkWindowsEnv checks a variable for cmd.exe's set "K=V": a quote would
// end it, a % would expand, and a line break would end the command.
func checkWindowsEnv(k, v string) error {
	if strings.ContainsAny(k+v, "\"%\r\n") {
		return errdefs.Invalidf("env.%s: a Windows guest's variables must not contain \", %% or line breaks", k)
	}
	return nil
}

// qgaResult turns qemu-ga's result into exec_command's shape. Windows
// output is decoded to UTF-8 with LF line ends (qga.DecodeOutput; the
// shell runs with code page 65001), and each stream is cut at limit.
func qgaResult(osName string, out *qga.ExecResult, limit int64, d time.Duration) *sandbox.ExecResult {
	res := &sandbox.ExecResult{DurationMS: d.Milliseconds()}
	if out == nil {
		res.Termination = sandbox.Termination{Cause: sandbox.CauseLost}
		return res
	}
	stream := func(b []byte, agentCut bool) (string, int64, bool) {
		n := int64(len(b))
		s := string(b)
		if osName == vm.OSWindows {
			s, _ = qga.DecodeOutput(b, 65001) // 65001 never fails
		}
		cut := agentCut
		if limit > 0 && int64(len(s)) > limit {
			s, cut = strings.ToValidUTF8(s[:limit], ""), true
		}
		return s, n, cut
	}
	res.Stdout, res.StdoutBytes, res.StdoutTruncated = stream(out.Stdout, out.StdoutTruncated)
	res.Stderr, res.StderrBytes, res.StderrTruncated = stream(out.Stderr, out.StderrTruncated)
	res.ExitCode = out.ExitCode
	switch {
	case out.Signaled && osName != vm.OSWindows:
		res.Termination = sandbox.Termination{Cause: sandbox.CauseSignal, Signal: unix.SignalName(syscall.Signal(out.Signal))}
	case out.Signaled:
		res.Termination = sandbox.Termination{Cause: sandbox.CauseSignal, Detail: fmt.Sprintf("ended by exception 0x%x", uint32(out.Signal))}
	default:
		code := out.ExitCode
		res.Termination = sandbox.Termination{Cause: sandbox.CauseExited, ExitCode: &code}
	}
	return res
}

// qgaKilled is what qgaKill did.
type qgaKilled struct {
	res    *qga.ExecResult // the command's outcome after the kill; nil if it did not end
	detail string
}

// qgaKill ends a command qemu-ga started, whose pid it reported: qemu-ga
// has no kill, so another guest-exec does it. On Linux a shell stops the
// process and, depth first through /proc/PID/task/*/children, every
// descendant, then kills each (a descendant that left the tree by
// double-forking escapes: there is no cgroup of the command in a guest we
// did not build); on Windows `taskkill /F /T /PID` ends the tree. Then
// it collects the command's result (its output so far) from
// guest-exec-status.
func (e *Engine) qgaKill(ctx context.Context, c *qga.Client, osName string, pid int) qgaKilled {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), qgaKillWait)
	defer cancel()
	k := qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c",
		`t() { kill -STOP "$1" 2>/dev/null; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do t "$c"; done; kill -KILL "$1" 2>/dev/null; }; t "$1"`,
		"kill-tree", strconv.Itoa(pid)}, Env: []string{"PATH=" + qgaLinuxPath}}
	how := "its process tree SIGKILLed through qemu-ga"
	if osName == vm.OSWindows {
		k = qga.ExecRequest{Path: `C:\Windows\System32\taskkill.exe`, Args: []string{"/F", "/T", "/PID", strconv.Itoa(pid)}, Windows: true}
		how = "taskkill /F /T through qemu-ga"
	}
	if _, err := c.Exec(ctx, k); err != nil {
		e.log.Warn("kill a timed-out guest-exec", "pid", pid, "err", err)
		return qgaKilled{detail: fmt.Sprintf("the kill through qemu-ga failed: %s; pid %d may still run in the guest", errdefs.MessageOf(err), pid)}
	}
	for {
		out, err := c.Status(ctx, pid)
		if err == nil && out != nil {
			return qgaKilled{res: out, detail: how}
		}
		select {
		case <-ctx.Done():
			return qgaKilled{detail: how + fmt.Sprintf("; pid %d had not ended %s later", pid, qgaKillWait)}
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// qgaPath checks a path of a QGA guest: absolute in the guest's OS (C:\...
// on Windows). There is no working directory to resolve a relative one
// against: an administrator's disk need not have /workspace.
func qgaPath(osName, p string) error {
	if p == "" {
		return errdefs.Invalidf("path: required")
	}
	if err := qga.CheckPath(osName, p); err != nil {
		return err
	}
	if osName != vm.OSWindows && path.Clean(p) != p {
		return errdefs.Invalidf("path: %q is not clean (no ., .. or doubled /)", p)
	}
	return nil
}

// qgaWriteFile is vm_file_write on a QGA guest.
func (e *Engine) qgaWriteFile(ctx context.Context, r *vmRef, req apitypes.VMFileWriteRequest) (*FileResult, error) {
	data, err := decodeContent(req.Encoding, req.Content)
	if err != nil {
		return nil, err
	}
	return e.qgaWrite(ctx, r, req.Path, req.Mode, data)
}

// qgaWrite writes a file in a QGA guest with guest-file-write (creating or
// truncating it), creating its parent directory when the open fails for
// want of one. qemu-ga creates files with its own default mode (0666 less
// its umask on Linux); a mode is then set with chmod on Linux, and has no
// meaning on Windows (ignored there).
func (e *Engine) qgaWrite(ctx context.Context, r *vmRef, p, modeText string, data []byte) (*FileResult, error) {
	if err := qgaPath(r.qgaOS, p); err != nil {
		return nil, err
	}
	mode, err := parseMode(modeText)
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, errdefs.Invalidf("content: %d bytes exceeds the maximum %d", len(data), MaxFileBytes)
	}
	var n int64
	err = e.sandboxes.RunCommand(ctx, r.info.ID, func(sandbox.Handle) error {
		c, err := r.v.QGA(ctx)
		if err != nil {
			return err
		}
		n, err = c.WriteFile(ctx, p, bytes.NewReader(data))
		var qe *qga.Error
		if errors.As(err, &qe) && qe.Command == "guest-file-open" {
			if merr := qgaMkdirParent(ctx, c, r.qgaOS, p); merr != nil {
				return errdefs.Wrap(errdefs.InvalidArgument, err, "path: cannot create %s in the guest: %s (nor its parent: %s)", p, qe.Desc, errdefs.MessageOf(merr))
			}
			n, err = c.WriteFile(ctx, p, bytes.NewReader(data))
		}
		if errors.As(err, &qe) {
			return errdefs.Wrap(errdefs.InvalidArgument, err, "path: cannot write %s in the guest: %s", p, qe.Desc)
		}
		if err == nil && modeText != "" && r.qgaOS != vm.OSWindows {
			err = qgaChmod(ctx, c, p, mode)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &FileResult{Path: p, Size: n}, nil
}

// qgaChmod sets a file's permission bits in a Linux guest.
func qgaChmod(ctx context.Context, c *qga.Client, p string, mode uint32) error {
	res, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/chmod", Args: []string{fmt.Sprintf("%04o", mode), "--", p}})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return errdefs.Invalidf("mode: chmod in the guest exited %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// qgaMkdirParent creates p's parent directory in the guest.
func qgaMkdirParent(ctx context.Context, c *qga.Client, osName, p string) error {
	x := qga.ExecRequest{Path: "/bin/mkdir", Args: []string{"-p", "--", path.Dir(p)}}
	if osName == vm.OSWindows {
		dir := p[:strings.LastIndexByte(p, '\\')]
		var err error
		// A Windows path holds no quote (an invalid file name character).
		if x.Path, x.Args, err = qga.ShellCommand(osName, fmt.Sprintf(`if not exist "%s\" mkdir "%s"`, dir, dir)); err != nil {
			return err
		}
		x.Windows = true
	}
	res, err := c.Exec(ctx, x)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return errdefs.Invalidf("mkdir exited %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// qgaReadFile is vm_file_read on a QGA guest.
func (e *Engine) qgaReadFile(ctx context.Context, r *vmRef, req apitypes.VMFileReadRequest) (*FileReadResult, error) {
	enc := req.Encoding
	switch enc {
	case "", "utf-8", "utf8":
		enc = "utf-8"
	case "base64":
	default:
		return nil, errdefs.Invalidf("encoding: must be utf-8 or base64, got %q", req.Encoding)
	}
	d, err := e.qgaRead(ctx, r, req.Path, req.Offset, req.MaxBytes)
	if err != nil {
		return nil, err
	}
	res := &FileReadResult{Path: d.Path, Size: d.Size, Offset: req.Offset, Encoding: enc}
	if enc == "utf-8" && utf8.Valid(d.Data) {
		res.Content = string(d.Data)
	} else {
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(d.Data)
	}
	if d.Truncated {
		res.Truncated, res.NextOffset = true, req.Offset+int64(len(d.Data))
	}
	return res, nil
}

// qgaRead reads at most max bytes (0: DefaultReadBytes) at offset of a
// file in a QGA guest.
func (e *Engine) qgaRead(ctx context.Context, r *vmRef, p string, offset, max int64) (*agent.FileData, error) {
	if err := qgaPath(r.qgaOS, p); err != nil {
		return nil, err
	}
	max, err := readWindow(offset, max)
	if err != nil {
		return nil, err
	}
	d := &agent.FileData{Path: p}
	err = e.sandboxes.RunCommand(ctx, r.info.ID, func(sandbox.Handle) error {
		c, err := r.v.QGA(ctx)
		if err != nil {
			return err
		}
		d.Data, d.Size, err = c.ReadFileAt(ctx, p, offset, max)
		var qe *qga.Error
		if errors.As(err, &qe) {
			return errdefs.Wrap(errdefs.NotFound, err, "path: cannot read %s in the guest: %s", p, qe.Desc)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	d.Truncated = offset+int64(len(d.Data)) < d.Size
	return d, nil
}

// VMWriteFileFrom writes size bytes from r to path in a VM (uploads:
// PUT /v1/vms/{id}/files).
func (e *Engine) VMWriteFileFrom(ctx context.Context, id, p, mode string, size int64, body io.Reader) (*FileResult, error) {
	r, err := e.liveVMRef(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.qgaOS == "" {
		return e.WriteFileFrom(ctx, id, p, mode, false, size, body)
	}
	if size > MaxFileBytes {
		return nil, errdefs.Invalidf("content: %d bytes exceeds the maximum %d", size, MaxFileBytes)
	}
	data, err := io.ReadAll(io.LimitReader(body, size+1))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "content: read the upload")
	}
	if int64(len(data)) != size {
		return nil, errdefs.Invalidf("content: %d bytes, not the %d announced", len(data), size)
	}
	return e.qgaWrite(ctx, r, p, mode, data)
}

// VMReadFileRaw reads (part of) a file in a VM as bytes (downloads:
// GET /v1/vms/{id}/files).
func (e *Engine) VMReadFileRaw(ctx context.Context, req FileReadRequest) (*agent.FileData, error) {
	r, err := e.liveVMRef(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if r.qgaOS == "" {
		return e.ReadFileRaw(ctx, req)
	}
	return e.qgaRead(ctx, r, req.Path, req.Offset, req.MaxBytes)
}

// qgaTestDir is where a vm_test on a QGA guest puts its files and runs its
// steps: a directory of the run under the guest's temporary directory (an
// administrator's disk has no /workspace).
func qgaTestDir(osName, runID string) string {
	if osName == vm.OSWindows {
		return `C:\Windows\Temp\sandboxd-vm-test\` + runID
	}
	return "/var/tmp/sandboxd-vm-test/" + runID
}

// qgaJoin joins a clean relative path (WorkspaceRel) to a directory of the
// guest's OS.
func qgaJoin(osName, dir, rel string) string {
	if osName == vm.OSWindows {
		return dir + `\` + strings.ReplaceAll(rel, "/", `\`)
	}
	return dir + "/" + rel
}

// qgaTestStep runs one vm_test step on a QGA guest, in dir, under what is
// left of the run's deadline, and records it like the pipeline's steps.
func (e *Engine) qgaTestStep(ctx context.Context, run *CodeRun, r *vmRef, a *Attempt, res *RunResult, name, dir, command string) (*RunStep, error) {
	line := "cd '" + dir + "' && " + command
	if r.qgaOS == vm.OSWindows {
		line = `cd /d "` + dir + `" && ` + command
	}
	remaining := min(time.Until(run.deadline), e.cfg.Sandbox.MaxExecTimeout.D())
	var er *sandbox.ExecResult
	if remaining < 10*time.Millisecond {
		er = &sandbox.ExecResult{ExitCode: -1, Termination: sandbox.Termination{Cause: sandbox.CauseTimeout, Detail: "no time left for this step"}}
	} else {
		secs := remaining.Seconds()
		var err error
		if er, err = e.qgaExec(ctx, r, apitypes.VMExecRequest{VMID: r.info.ID, Command: line, Env: a.Env, TimeoutSeconds: &secs,
			MaxOutputBytes: a.MaxOutputBytes}, run.recordOutput(a)); err != nil {
			return nil, err
		}
	}
	prog, args, _ := qga.ShellCommand(r.qgaOS, line)
	return run.recordStep(res, name, append([]string{prog}, args...), er), nil
}

// qgaMkdir makes directory dir (and its parents) in a QGA guest.
func (e *Engine) qgaMkdir(ctx context.Context, r *vmRef, dir string) error {
	return e.sandboxes.RunCommand(ctx, r.info.ID, func(sandbox.Handle) error {
		c, err := r.v.QGA(ctx)
		if err != nil {
			return err
		}
		// qgaMkdirParent makes the parent of a path: of one inside dir.
		return qgaMkdirParent(ctx, c, r.qgaOS, qgaJoin(r.qgaOS, dir, "x"))
	})
}
