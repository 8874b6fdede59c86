package qemu

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// command is the ExecSpec of a shell command line as the engine makes it.
func command(line string) sandbox.ExecSpec {
	return sandbox.ExecSpec{Command: line, Argv: []string{"/bin/sh", "-c", line}}
}

func withCwd(s sandbox.ExecSpec, cwd string) sandbox.ExecSpec {
	s.Cwd = cwd
	return s
}

// TestQGACommand: what exec_command sends to qemu-ga on a guest that runs only
// that. Windows: cmd.exe with the console in UTF-8 and the environment as
// cmd's set (guest-exec's env would replace Windows's whole environment);
// Linux: /bin/sh -c with an environment that has a PATH.
func TestQGACommand(t *testing.T) {
	vmEnv := map[string]string{"A": "vm", "B": "x y"}
	// The environment as the sandbox manager merges it: the sandbox's,
	// then the request's.
	env := func(req map[string]string) []string { return sandbox.MergeEnv(vmEnv, req) }
	x, err := qgaCommand("windows", command("ver"), env(map[string]string{"A": "req"}))
	if err != nil {
		t.Fatal(err)
	}
	if x.Path != `C:\Windows\System32\cmd.exe` || !x.Windows || x.Env != nil ||
		x.Args[len(x.Args)-1] != `chcp 65001 >NUL & set "A=req" & set "B=x y" & ver` {
		t.Errorf("windows command: %+v", x)
	}
	x, err = qgaCommand("windows", sandbox.ExecSpec{Argv: []string{`C:\Windows\System32\whoami.exe`, "/all"}}, nil)
	if err != nil || x.Path != `C:\Windows\System32\whoami.exe` || !slices.Equal(x.Args, []string{"/all"}) || x.Env != nil {
		t.Errorf("windows argv: %+v %v", x, err)
	}
	x, err = qgaCommand("linux", command("echo $A"), env(map[string]string{"A": "req"}))
	if err != nil || x.Path != "/bin/sh" || !slices.Equal(x.Args, []string{"-c", "echo $A"}) ||
		!strings.HasPrefix(x.Env[0], "PATH=/usr/local/sbin:") || !slices.Contains(x.Env, "A=req") || !slices.Contains(x.Env, "B=x y") || slices.Contains(x.Env, "A=vm") {
		t.Errorf("linux command: %+v %v", x, err)
	}
	// A working directory: cmd.exe changes to it (and ends if it cannot);
	// on Linux a shell does, then execs the command in its place.
	x, err = qgaCommand("windows", withCwd(command("dir"), `C:\Users\Public`), sandbox.MergeEnv(map[string]string{"K": "v"}))
	if err != nil || x.Args[len(x.Args)-1] != `chcp 65001 >NUL & cd /d "C:\Users\Public" || exit 125 & set "K=v" & dir` {
		t.Errorf("windows cwd: %+v %v", x, err)
	}
	x, err = qgaCommand("linux", sandbox.ExecSpec{Argv: []string{"ls", "-l"}, Cwd: "/var/tmp"}, nil)
	if err != nil || x.Path != "/bin/sh" || !slices.Equal(x.Args, []string{"-c", `cd -- "$1" || exit 125; shift; exec "$@"`, "sh", "/var/tmp", "ls", "-l"}) {
		t.Errorf("linux cwd argv: %+v %v", x, err)
	}
	x, err = qgaCommand("linux", withCwd(command("pwd"), "/var/tmp"), nil)
	if err != nil || x.Path != "/bin/sh" || !slices.Equal(x.Args[3:], []string{"/var/tmp", "/bin/sh", "-c", "pwd"}) {
		t.Errorf("linux cwd command: %+v %v", x, err)
	}
	for name, c := range map[string]struct {
		os    string
		req   sandbox.ExecSpec
		env   map[string]string
		field string
	}{
		"cwd relative":         {"linux", withCwd(command("true"), "tmp"), nil, "cwd:"},
		"windows cwd argv":     {"windows", sandbox.ExecSpec{Argv: []string{`C:\x.exe`}, Cwd: `C:\Users`}, nil, "cwd:"},
		"windows cwd relative": {"windows", withCwd(command("dir"), `Users`), nil, "cwd:"},
		"windows cwd quote":    {"windows", withCwd(command("dir"), `C:\a"b`), nil, "cwd:"},
		"windows argv env":     {"windows", sandbox.ExecSpec{Argv: []string{`C:\x.exe`}}, map[string]string{"K": "v"}, "env:"},
		"windows env quote":    {"windows", command("ver"), map[string]string{"K": `a"b`}, "env.K:"},
		"windows env percent":  {"windows", command("ver"), map[string]string{"K": "%PATH%"}, "env.K:"},
		"windows env new line": {"windows", command("ver"), map[string]string{"K": "a\r\nb"}, "env.K:"},
	} {
		if _, err := qgaCommand(c.os, c.req, sandbox.MergeEnv(c.env)); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got %v, want invalid_argument naming %s", name, err, c.field)
		}
	}
}

func TestQGAPath(t *testing.T) {
	for _, ok := range []struct{ os, p string }{{"windows", `C:\Users\x.txt`}, {"linux", "/root/x"}} {
		if err := qgaPath(ok.os, "path", ok.p); err != nil {
			t.Errorf("%s %q: %v", ok.os, ok.p, err)
		}
	}
	for _, bad := range []struct{ os, p string }{{"windows", `Users\x.txt`}, {"windows", "/root/x"}, {"windows", ""},
		{"linux", "x.txt"}, {"linux", "/a/../b"}, {"linux", "/a\x00"}} {
		if err := qgaPath(bad.os, "path", bad.p); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "path:") {
			t.Errorf("%s %q: got %v, want invalid_argument naming path", bad.os, bad.p, err)
		}
	}
}

// TestQGAResult: qemu-ga's result in exec_command's shape. Windows output
// is UTF-8 (the shell switches to code page 65001) with CRLF, or, from a
// program that ignores the console's code page, the OEM code page (437);
// stdout and stderr stay apart; the output limit cuts each stream.
func TestQGAResult(t *testing.T) {
	out := &qga.ExecResult{ExitCode: 3, Stdout: []byte("caf\xc3\xa9\r\nline 2\r\n"), Stderr: []byte("r\x82sum\x82\r\n")}
	res := qgaResult("windows", out, 1<<20, 1500*time.Millisecond)
	if res.Stdout != "café\nline 2\n" || res.Stderr != "résumé\n" || res.ExitCode != 3 || res.DurationMS != 1500 ||
		res.Termination.Cause != sandbox.CauseExited || res.Termination.ExitCode == nil || *res.Termination.ExitCode != 3 ||
		res.StdoutTruncated || res.StdoutBytes != int64(len(out.Stdout)) {
		t.Errorf("windows result: %+v", res)
	}
	res = qgaResult("linux", &qga.ExecResult{Signaled: true, Signal: 9, ExitCode: 137, Stdout: []byte("0123456789"), StderrTruncated: true}, 4, 0)
	if res.Termination.Cause != sandbox.CauseSignal || res.Termination.Signal != "SIGKILL" || res.ExitCode != 137 ||
		res.Stdout != "0123" || !res.StdoutTruncated || res.StdoutBytes != 10 || !res.StderrTruncated {
		t.Errorf("linux signalled, cut result: %+v", res)
	}
}
