package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestBlockedSyscallDiagnostics: a program refused a syscall learns which
// one and how often, in run_code's result and its run record.
func TestBlockedSyscallDiagnostics(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	// os.unshare is Python 3.12; the image's Python may be older, where
	// ctypes makes the same call.
	code := `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(3):
    if hasattr(os, "unshare"):
        try:
            os.unshare(os.CLONE_NEWUSER)
            print("allowed")
        except PermissionError as e:
            print("refused", e.errno)
    elif libc.unshare(0x10000000) != 0:
        print("refused", ctypes.get_errno())
    else:
        print("allowed")
`
	res := env.runCode(t, RunCodeRequest{Language: "python", Code: code})
	if res.Stdout != strings.Repeat("refused 1\n", 3) {
		t.Fatalf("stdout %q stderr %q, want three EPERM refusals", res.Stdout, res.Stderr)
	}
	if len(res.BlockedSyscalls) != 1 || res.BlockedSyscalls[0].Name != "unshare" || res.BlockedSyscalls[0].Count != 3 {
		t.Fatalf("blocked syscalls = %+v, want unshare ×3", res.BlockedSyscalls)
	}
	b, err := os.ReadFile(filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID, "metadata.json"))
	if err != nil || !strings.Contains(string(b), `"blockedSyscalls"`) || !strings.Contains(string(b), `"unshare"`) {
		t.Errorf("run record does not keep the blocked syscalls (%v):\n%s", err, b)
	}
	// A clean program reports none.
	res = env.runCode(t, RunCodeRequest{Language: "python", Code: "print(1)\n"})
	if len(res.BlockedSyscalls) != 0 {
		t.Errorf("blocked syscalls of print(1) = %+v", res.BlockedSyscalls)
	}
}

// TestSeccompProfilePerSandbox: strict refuses what default allows
// (ptrace), chosen per sandbox; an unknown profile is invalid_argument.
func TestSeccompProfilePerSandbox(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "python", SeccompProfile: "nosuch"}); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "seccomp_profile") {
		t.Fatalf("unknown profile: %v, want invalid_argument naming seccomp_profile", err)
	}
	script := "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
	for _, tc := range []struct{ profile, want, blocked string }{
		{"default", "0 0", ""},
		{"strict", "-1 1", "ptrace"},
	} {
		info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "python", SeccompProfile: tc.profile})
		if err != nil {
			t.Fatal(err)
		}
		if info.SeccompProfile != tc.profile {
			t.Errorf("sandbox seccomp_profile = %q, want %q", info.SeccompProfile, tc.profile)
		}
		res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: []string{"python3", "-c", script}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(res.Stdout); got != tc.want {
			t.Errorf("%s: ptrace(TRACEME) = %q (stderr %q), want %q", tc.profile, got, res.Stderr, tc.want)
		}
		var blocked string
		for _, b := range res.BlockedSyscalls {
			blocked += b.Name
		}
		if blocked != tc.blocked {
			t.Errorf("%s: blocked syscalls %+v, want %q", tc.profile, res.BlockedSyscalls, tc.blocked)
		}
	}
}

// TestCreateIdempotentOnRequestID: a retried create returns the sandbox the
// first one made; concurrent retries start one sandbox.
func TestCreateIdempotentOnRequestID(t *testing.T) {
	requireRoot(t)
	env := newTestEngine(t)
	ctx := context.Background()
	rid := "req-" + randHex(6)
	ids := make(chan string, 3)
	for range 3 {
		go func() {
			info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", RequestID: rid})
			if err != nil {
				t.Error(err)
				ids <- ""
				return
			}
			ids <- info.ID
		}()
	}
	first := <-ids
	for range 2 {
		if id := <-ids; id != first {
			t.Errorf("retries of request %s made sandboxes %s and %s", rid, first, id)
		}
	}
	live, err := env.ListSandboxes(ctx, "")
	if err != nil || len(live) != 1 {
		t.Errorf("live sandboxes = %d (%v), want 1", len(live), err)
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", RequestID: "bad id"}); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "request_id") {
		t.Errorf("bad request id: %v", err)
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Labels: map[string]string{RequestIDLabel: "x"}}); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("reserved label: %v", err)
	}
}

// TestCompatSyscallsKilled: the profiles allow the native syscall ABI only.
// A 64-bit program that makes a 32-bit (int 0x80, compat) syscall is killed
// by SIGSYS instead of having it run or refused with an errno; the same
// program's native syscall runs (the control that the program executes at
// all). Filtering one ABI instead of three also compiles the filter in
// about a fifth of the time in every sandbox's runc init (docs/security.md).
func TestCompatSyscallsKilled(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	// Two minimal static x86-64 ELFs: "mov eax,1; mov ebx,42; int 0x80"
	// (i386 exit(42)) falling through to "mov eax,60; mov edi,7; syscall"
	// (exit(7)) if the compat call were refused with an errno; and the
	// native exit(7) alone.
	script := `import os, struct, subprocess
def elf(code):
    base, eh, ph = 0x400000, 64, 56
    n = eh + ph + len(code)
    hdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack("<HHIQQQIHHHHHH", 2, 0x3e, 1, base + eh + ph, eh, 0, 0, eh, ph, 1, 0, 0, 0)
    return hdr + struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, n, n, 0x1000) + code
native = bytes([0xb8, 60, 0, 0, 0, 0xbf, 7, 0, 0, 0, 0x0f, 0x05])
compat = bytes([0xb8, 1, 0, 0, 0, 0xbb, 42, 0, 0, 0, 0xcd, 0x80]) + native
for name, code in (("native", native), ("compat", compat)):
    path = "/workspace/" + name
    with open(path, "wb") as f:
        f.write(elf(code))
    os.chmod(path, 0o755)
    print(name, subprocess.run([path]).returncode)
`
	info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: []string{"python3", "-c", script}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(res.Stdout), "native 7\ncompat -31"; got != want {
		t.Errorf("exit statuses %q (stderr %q), want %q: the compat syscall must be killed by SIGSYS", got, res.Stderr, want)
	}
}
