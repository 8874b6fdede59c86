package qemu

// The qemu-ga handle kind: a VM booting an administrator's disk
// (vm.images.windows, vm.images.linux) has no sandbox-agent, so its
// commands and files go through the QEMU guest agent (pkg/vm/qga) instead:
// the handle is a sandbox.GuestOps, and the Manager routes exec_command
// and file_read/file_write to it (as commands of the sandbox: running
// meanwhile, counted by the idle timeout). What qemu-ga cannot do (jobs,
// terminals, listings, ports, workspace snapshots) the handle's
// capabilities leave out, so the Manager refuses it naming the capability.
//
// Security boundary: qemu-ga runs as root on Linux and as LocalSystem on
// Windows, so a command or file operation here has the guest's highest
// privilege. The guest itself is the boundary (QEMU's seccomp, -runas, the
// cgroup, no network: pkg/vm); nothing the guest answers is trusted
// (pkg/vm/qga), and output is capped by the output limit.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// qgaCapabilities: commands and files through qemu-ga, the whole machine's
// snapshots and its screen; no agent of ours.
var qgaCapabilities = sandbox.Capabilities{GuestAgent: true, MemorySnapshot: true, Screenshot: true}

var _ sandbox.GuestOps = (*qgaHandle)(nil)

// qgaLinuxPath is the PATH of commands in a Linux QGA guest: guest-exec
// with an environment replaces qemu-ga's whole environment.
const qgaLinuxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// qgaKillWait bounds the kill of a timed-out command and the collection
// of what it wrote.
const qgaKillWait = 10 * time.Second

// GuestExec implements sandbox.GuestOps: the command through the guest's
// shell (qga.ShellCommand: /bin/sh -c, or cmd.exe on Windows) or argv as
// is, stdin as guest-exec input, env, and the timeout enforced from here
// (see kill). guest-exec has no working directory: with cwd a shell changes
// to it first (qgaCommand); without, commands start in qemu-ga's (/ on
// Linux, C:\Windows\System32 on Windows).
func (h *qgaHandle) GuestExec(ctx context.Context, spec sandbox.ExecSpec, env []string, limit int64) (*sandbox.ExecResult, error) {
	x, err := qgaCommand(h.os, spec, env)
	if err != nil {
		return nil, err
	}
	x.Stdin = spec.Stdin
	c, err := h.v.QGA(ctx)
	if err != nil {
		return nil, err
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
		return qgaResult(h.os, out, limit, time.Since(start)), nil
	case errors.As(err, &running) && ctx.Err() == nil:
		// The timeout: kill it and report what it wrote.
		killed := h.kill(ctx, c, running.PID)
		res := qgaResult(h.os, killed.res, limit, time.Since(start))
		res.ExitCode = -1
		res.Termination = sandbox.Termination{Cause: sandbox.CauseTimeout,
			Detail: fmt.Sprintf("killed after the %s timeout (%s)", spec.Timeout, killed.detail)}
		return res, nil
	case errors.As(err, &running):
		h.kill(ctx, c, running.PID)
		return nil, errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "command cancelled")
	default:
		var qe *qga.Error
		if errors.As(err, &qe) {
			// qemu-ga refused it: a program that does not exist, a
			// disabled guest-exec.
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "argv: the guest agent could not run %s: %s", x.Path, qe.Desc)
		}
		return nil, err
	}
}

// qgaCommand is the guest-exec of spec (checked by the engine) on a QGA
// guest of osName, with env (KEY=VALUE, the sandbox's and the request's).
func qgaCommand(osName string, spec sandbox.ExecSpec, env []string) (qga.ExecRequest, error) {
	if spec.Cwd != "" {
		if err := qga.CheckPath(osName, spec.Cwd); err != nil {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: %s", strings.TrimPrefix(errdefs.MessageOf(err), "path: "))
		}
		if osName == vm.OSWindows && spec.Command == "" {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: a Windows guest takes cwd with command, not argv (guest-exec has no working directory; cmd.exe changes to it)")
		}
		if osName == vm.OSWindows && strings.ContainsAny(spec.Cwd, "\"%\r\n") {
			return qga.ExecRequest{}, errdefs.Invalidf("cwd: a Windows guest's directory must not contain \", %% or line breaks")
		}
	}
	x := qga.ExecRequest{Windows: osName == vm.OSWindows}
	var err error
	switch {
	case spec.Command != "" && osName == vm.OSWindows:
		// cmd.exe's set: guest-exec's env would replace the whole
		// environment, which Windows programs need (SystemRoot, PATH).
		// The working directory by cd, which ends the command when it
		// fails ("a || b & c" is "(a || b) & c" in cmd.exe).
		var pre strings.Builder
		if spec.Cwd != "" {
			fmt.Fprintf(&pre, "cd /d \"%s\" || exit %d & ", spec.Cwd, qgaCwdExit)
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			if err := CheckWindowsEnv(k, v); err != nil {
				return x, err
			}
			fmt.Fprintf(&pre, "set \"%s=%s\" & ", k, v)
		}
		x.Path, x.Args, err = qga.ShellCommand(osName, pre.String()+spec.Command)
	case osName == vm.OSWindows:
		if len(env) > 0 {
			return x, errdefs.Invalidf("env: a Windows guest takes environment variables with command, not argv (qemu-ga would replace the whole environment)")
		}
		x.Path, x.Args = spec.Argv[0], spec.Argv[1:]
	case spec.Command != "":
		x.Path, x.Args, err = qga.ShellCommand(osName, spec.Command)
	default:
		x.Path, x.Args = spec.Argv[0], spec.Argv[1:]
	}
	if osName != vm.OSWindows {
		x.Env = append([]string{"PATH=" + qgaLinuxPath, "LANG=C.UTF-8", "HOME=/root"}, env...)
		if spec.Cwd != "" && err == nil {
			// guest-exec has no working directory: a shell changes to
			// it and execs the command (argv or the command's shell) in
			// place, so the exit status and signals are the command's.
			x.Args = append([]string{"-c", `cd -- "$1" || exit ` + fmt.Sprint(qgaCwdExit) + `; shift; exec "$@"`, "sh", spec.Cwd, x.Path}, x.Args...)
			x.Path = "/bin/sh"
		}
	}
	return x, err
}

// qgaCwdExit is the exit status of a command on a QGA guest whose working
// directory could not be entered (the shell's own message on stderr says
// why), as env(1) and chroot(1) answer 125 when they fail themselves.
const qgaCwdExit = 125

// CheckWindowsEnv checks a variable for cmd.exe's set "K=V": a quote would
// end it, a % would expand, and a line break would end the command.
func CheckWindowsEnv(k, v string) error {
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

// qgaKilled is what kill did.
type qgaKilled struct {
	res    *qga.ExecResult // the command's outcome after the kill; nil if it did not end
	detail string
}

// kill ends a command qemu-ga started, whose pid it reported: qemu-ga has
// no kill, so another guest-exec does it. On Linux a shell stops the
// process and, depth first through /proc/PID/task/*/children, every
// descendant, then kills each (a descendant that left the tree by
// double-forking escapes: there is no cgroup of the command in a guest we
// did not build); on Windows `taskkill /F /T /PID` ends the tree. Then it
// collects the command's result (its output so far) from
// guest-exec-status.
func (h *qgaHandle) kill(ctx context.Context, c *qga.Client, pid int) qgaKilled {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), qgaKillWait)
	defer cancel()
	k := qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c",
		`t() { kill -STOP "$1" 2>/dev/null; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do t "$c"; done; kill -KILL "$1" 2>/dev/null; }; t "$1"`,
		"kill-tree", strconv.Itoa(pid)}, Env: []string{"PATH=" + qgaLinuxPath}}
	how := "its process tree SIGKILLed through qemu-ga"
	if h.os == vm.OSWindows {
		k = qga.ExecRequest{Path: `C:\Windows\System32\taskkill.exe`, Args: []string{"/F", "/T", "/PID", strconv.Itoa(pid)}, Windows: true}
		how = "taskkill /F /T through qemu-ga"
	}
	if _, err := c.Exec(ctx, k); err != nil {
		h.log.Warn("kill a timed-out guest-exec", "pid", pid, "err", err)
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

// GuestCheckPath implements sandbox.GuestOps: absolute in the guest's OS
// (C:\... on Windows). There is no working directory to resolve a relative
// one against: an administrator's disk need not have /workspace.
func (h *qgaHandle) GuestCheckPath(field, p string) error {
	return qgaPath(h.os, field, p)
}

func qgaPath(osName, field, p string) error {
	if p == "" {
		return errdefs.Invalidf("%s: required", field)
	}
	if err := qga.CheckPath(osName, p); err != nil {
		return errdefs.Invalidf("%s: %s", field, strings.TrimPrefix(errdefs.MessageOf(err), "path: "))
	}
	if osName != vm.OSWindows && path.Clean(p) != p {
		return errdefs.Invalidf("%s: %q is not clean (no ., .. or doubled /)", field, p)
	}
	return nil
}

// GuestWriteFile implements sandbox.GuestOps with guest-file-write
// (creating or truncating the file), creating its parent directory when the
// open fails for want of one. qemu-ga creates files with its own default
// mode (0666 less its umask on Linux); a mode is then set with chmod on
// Linux, and has no meaning on Windows (ignored there).
func (h *qgaHandle) GuestWriteFile(ctx context.Context, p string, mode uint32, data []byte) (int64, error) {
	if err := qgaPath(h.os, "path", p); err != nil {
		return 0, err
	}
	c, err := h.v.QGA(ctx)
	if err != nil {
		return 0, err
	}
	n, err := c.WriteFile(ctx, p, bytes.NewReader(data))
	var qe *qga.Error
	if errors.As(err, &qe) && qe.Command == "guest-file-open" {
		if merr := qgaMkdirParent(ctx, c, h.os, p); merr != nil {
			return 0, errdefs.Wrap(errdefs.InvalidArgument, err, "path: cannot create %s in the guest: %s (nor its parent: %s)", p, qe.Desc, errdefs.MessageOf(merr))
		}
		n, err = c.WriteFile(ctx, p, bytes.NewReader(data))
	}
	if errors.As(err, &qe) {
		return 0, errdefs.Wrap(errdefs.InvalidArgument, err, "path: cannot write %s in the guest: %s", p, qe.Desc)
	}
	if err == nil && mode != 0 && h.os != vm.OSWindows {
		err = qgaChmod(ctx, c, p, mode)
	}
	return n, err
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

// GuestReadFile implements sandbox.GuestOps: at most max bytes at offset
// (checked by the engine) of a file in the guest.
func (h *qgaHandle) GuestReadFile(ctx context.Context, p string, offset, max int64) (*agent.FileData, error) {
	if err := qgaPath(h.os, "path", p); err != nil {
		return nil, err
	}
	c, err := h.v.QGA(ctx)
	if err != nil {
		return nil, err
	}
	d := &agent.FileData{Path: p}
	d.Data, d.Size, err = c.ReadFileAt(ctx, p, offset, max)
	var qe *qga.Error
	if errors.As(err, &qe) {
		return nil, errdefs.Wrap(errdefs.NotFound, err, "path: cannot read %s in the guest: %s", p, qe.Desc)
	}
	if err != nil {
		return nil, err
	}
	d.Truncated = offset+int64(len(d.Data)) < d.Size
	return d, nil
}

// GuestMkdir makes directory dir (and its parents) in the guest of a
// sandbox handle of this backend that runs only qemu-ga (vm_test's
// directory of the run).
func GuestMkdir(ctx context.Context, h sandbox.Handle, dir string) error {
	qh, ok := h.(*qgaHandle)
	if !ok {
		return errdefs.Invalidf("sandbox_id: not a guest reached through qemu-ga")
	}
	c, err := qh.v.QGA(ctx)
	if err != nil {
		return err
	}
	// qgaMkdirParent makes the parent of a path: of one inside dir.
	return qgaMkdirParent(ctx, c, qh.os, GuestJoin(qh.os, dir, "x"))
}

// GuestTestDir is where a vm_test on a QGA guest of osName puts its files
// and runs its steps: a directory of the run under the guest's temporary
// directory (an administrator's disk has no /workspace).
func GuestTestDir(osName, runID string) string {
	if osName == vm.OSWindows {
		return `C:\Windows\Temp\sandboxd-vm-test\` + runID
	}
	return "/var/tmp/sandboxd-vm-test/" + runID
}

// GuestJoin joins a clean relative path to a directory of the guest's OS.
func GuestJoin(osName, dir, rel string) string {
	if osName == vm.OSWindows {
		return dir + `\` + strings.ReplaceAll(rel, "/", `\`)
	}
	return dir + "/" + rel
}
