// Package adversarial runs attack programs inside sandboxes through the
// engine — the way an agent's code would — and checks for each that the
// attack failed, that the result says why (an errno, a termination cause or
// a blocked syscall), and, after all of them, that the daemon is healthy, a
// neighbour sandbox is untouched and the host unchanged.
package adversarial

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init.
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// pyPrelude gives attack programs a syscall helper that prints
// "<name>: errno <n>" (or "<name>: ok") and the constants they need.
const pyPrelude = `import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    print(name + (": ok" if r >= 0 else ": errno %d" % ctypes.get_errno()))
`

// attack is one attack program and what its failure must look like.
type attack struct {
	name   string
	sh     string   // shell script, or
	py     string   // Python program (after pyPrelude)
	want   []string // each must appear in stdout+stderr
	cause  string   // expected termination cause; "" means any
	syscal string   // a syscall the result must list as blocked
	secs   float64  // timeout; 0: 20s
}

var attacks = []attack{
	// Namespace and mount escapes.
	{name: "unshare user namespace", py: "sc('unshare', 272, 0x10000000)", want: []string{"unshare: errno 1"}, syscal: "unshare"},
	{name: "unshare mount namespace", py: "sc('unshare', 272, 0x00020000)", want: []string{"unshare: errno 1"}, syscal: "unshare"},
	{name: "setns into init's mount namespace", py: "fd = os.open('/proc/1/ns/mnt', os.O_RDONLY) if os.access('/proc/1/ns/mnt', os.R_OK) else -1\nprint('open ns: denied' if fd < 0 else 'open ns: ok')\nsc('setns', 308, fd, 0)", want: []string{"setns: errno"}},
	{name: "mount tmpfs", py: "sc('mount', 165, b'none', b'/tmp', b'tmpfs', 0, 0)", want: []string{"mount: errno 1"}, syscal: "mount"},
	{name: "chroot", py: "sc('chroot', 161, b'/tmp')", want: []string{"chroot: errno 1"}, syscal: "chroot"},
	{name: "pivot_root", py: "sc('pivot_root', 155, b'/tmp', b'/tmp')", want: []string{"pivot_root: errno 1"}, syscal: "pivot_root"},
	{name: "open_tree/move_mount", py: "sc('open_tree', 428, -100, b'/', 1)", want: []string{"open_tree: errno 1"}, syscal: "open_tree"},
	// ptrace and signals to PID 1.
	{name: "ptrace attach to the agent", py: "sc('ptrace', 101, 16, 1, 0, 0)", want: []string{"ptrace: errno 1"}},
	{name: "SIGKILL to the agent", sh: "kill -9 1; echo rc=$?", want: []string{"rc=1"}},
	{name: "process_vm_readv of the agent", py: "class iov(ctypes.Structure):\n    _fields_ = [('b', ctypes.c_void_p), ('l', ctypes.c_size_t)]\nbuf = ctypes.create_string_buffer(8)\nl, r = iov(ctypes.cast(buf, ctypes.c_void_p), 8), iov(0x400000, 8)\nsc('process_vm_readv', 310, 1, ctypes.byref(l), 1, ctypes.byref(r), 1, 0)", want: []string{"process_vm_readv: errno 1"}},
	// Kernel interfaces.
	{name: "kexec_load", py: "sc('kexec_load', 246, 0, 0, 0, 0)", want: []string{"kexec_load: errno 1"}, syscal: "kexec_load"},
	{name: "init_module", py: "sc('init_module', 175, 0, 0, b'')", want: []string{"init_module: errno 1"}, syscal: "init_module"},
	{name: "bpf", py: "sc('bpf', 321, 0, 0, 0)", want: []string{"bpf: errno 1"}, syscal: "bpf"},
	{name: "perf_event_open", py: "sc('perf_event_open', 298, 0, 0, -1, -1, 0)", want: []string{"perf_event_open: errno 1"}, syscal: "perf_event_open"},
	{name: "io_uring_setup", py: "sc('io_uring_setup', 425, 4, 0)", want: []string{"io_uring_setup: errno 1"}, syscal: "io_uring_setup"},
	{name: "userfaultfd", py: "sc('userfaultfd', 323, 0)", want: []string{"userfaultfd: errno 1"}, syscal: "userfaultfd"},
	{name: "keyctl", py: "sc('keyctl', 250, 0, 0, 0)", want: []string{"keyctl: errno 1"}, syscal: "keyctl"},
	{name: "open_by_handle_at", py: "sc('open_by_handle_at', 304, 3, 0, 0)", want: []string{"open_by_handle_at: errno 1"}, syscal: "open_by_handle_at"},
	{name: "reboot", py: "sc('reboot', 169, 0xfee1dead, 672274793, 0x4321fedc, 0)", want: []string{"reboot: errno 1"}, syscal: "reboot"},
	{name: "settimeofday", py: "sc('settimeofday', 164, 0, 0)", want: []string{"settimeofday: errno 1"}},
	// /proc and /sys writes, devices, raw sockets.
	{name: "write /proc/sys", sh: "echo evil > /proc/sys/kernel/hostname; echo rc=$?", want: []string{"Read-only file system"}},
	{name: "write /proc/sysrq-trigger", sh: "echo c > /proc/sysrq-trigger; echo rc=$?", want: []string{"rc="}},
	{name: "write /sys", sh: "echo 1 > /sys/kernel/mm/ksm/run; echo rc=$?", want: []string{"rc="}},
	{name: "mknod a disk", sh: "mknod /tmp/sda b 8 0; echo rc=$?", want: []string{"rc=1", "Operation not permitted"}},
	{name: "raw socket", py: "try:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n    print('raw: ok')\nexcept OSError as e:\n    print('raw: errno', e.errno)", want: []string{"raw: errno 1"}},
	{name: "packet socket", py: "try:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)\n    print('packet: ok')\nexcept OSError as e:\n    print('packet: errno', e.errno)", want: []string{"packet: errno"}},
	// The agent: binary (CVE-2019-5736 pattern), socket, leaked fds (CVE-2024-21626 pattern).
	{name: "overwrite the agent binary", sh: "echo x > /.sandboxd/agent; echo rc=$?", want: []string{"Read-only file system"}},
	{name: "open /proc/1/exe for writing", sh: "echo x > /proc/1/exe; echo rc=$?", want: []string{"Permission denied"}},
	{name: "connect to the agent's socket", py: "s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('/.sandboxd/run/agent.sock')\n    print('connect: ok')\nexcept OSError as e:\n    print('connect: errno', e.errno)", want: []string{"connect: errno 13"}},
	{name: "leaked descriptors", sh: "ls /proc/self/fd | tr '\\n' ' '; echo; readlink /proc/self/cwd", want: []string{"0 1 2 3 \n/workspace"}},
	{name: "no capabilities, no_new_privs", sh: "grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '", want: []string{"CapPrm: 0000000000000000", "CapEff: 0000000000000000", "NoNewPrivs: 1"}},
	{name: "read /etc/shadow", sh: "cat /etc/shadow; echo rc=$?", want: []string{"rc=1", "Permission denied"}},
	// cgroups.
	{name: "write the sandbox's cgroup limits", sh: "for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max /.sandboxd/cgroup/memory/memory.limit_in_bytes /.sandboxd/cgroup/memory.max; do [ -e $f ] && { echo 9999999999 > $f; echo rc=$?; }; done; true", want: []string{"rc="}},
	{name: "move into another cgroup", sh: "for f in /.sandboxd/cgroup/unified/cgroup.procs /.sandboxd/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs /.sandboxd/cgroup/freezer/cgroup.procs /.sandboxd/cgroup/cpuacct/cgroup.procs; do [ -e $f ] && { echo $$ > $f; echo rc=$?; }; done; true", want: []string{"rc="}},
	// Bombs.
	{name: "fork bomb", sh: "b() { b | b & }; b; sleep 5", want: []string{"Cannot fork"}, secs: 8},
	{name: "memory bomb", py: "x = []\nwhile True:\n    x.append(bytearray(16 << 20))", cause: "oom"},
	{name: "disk bomb", sh: "head -c 400M /dev/zero > /workspace/fill; echo rc=$?; rm -f /workspace/fill", want: []string{"No space left on device", "rc=1"}},
	{name: "inode bomb", sh: "mkdir /tmp/i; cd /tmp/i; i=0; while [ $i -lt 200000 ]; do : > f$i || break; i=$((i+1)); done; echo made=$i; cd /; rm -rf /tmp/i", want: []string{"No space left on device"}, secs: 60},
	{name: "shm bomb", sh: "head -c 400M /dev/zero > /dev/shm/fill; echo rc=$?; rm -f /dev/shm/fill", want: []string{"rc=1"}},
	{name: "output flood", sh: "yes flood", cause: "output_limit"},
	{name: "zombies", py: "import time\nfor _ in range(200):\n    if os.fork() == 0:\n        os._exit(0)\ntime.sleep(0.5)\nprint('zombies:', sum(1 for p in os.listdir('/proc') if p.isdigit() and open('/proc/%s/stat' % p).read().split(')')[1].split()[0] == 'Z'))", want: []string{"zombies: "}},
	{name: "setsid survivors of a timeout", sh: `setsid sleep 1001 & (setsid sh -c "sleep 1003" &); (nohup sleep 1005 >/dev/null 2>&1 &); sleep 100`, cause: "timeout", secs: 3},
	{name: "thread bomb", py: "import threading, time\nn = 0\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\nexcept RuntimeError as e:\n    print('threads stopped at', n, e)\n    os._exit(0)", want: []string{"can't start new thread"}},
}

func TestAttacks(t *testing.T) {
	cfg := testenv.Config(t, "adv")
	testenv.EnsureImages(t, "python")
	cfg.Sandbox.Pids = 256
	cfg.Sandbox.OutputLimit = 1 << 20
	ctx := context.Background()
	e, err := engine.New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	cleanupEngine(t, e, cfg)
	host := snapshotHost(t)

	disk := int64(64)
	neighbour, err := e.CreateSandbox(ctx, engine.CreateSandboxRequest{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	canary := "canary-" + testenv.RandHex(8)
	mustExec(t, e, neighbour.ID, "echo "+canary+" > /workspace/canary; chmod 600 /workspace/canary; (setsid sleep 3600 &)")
	newAttacker := func(t *testing.T) *apitypes.Sandbox {
		t.Helper()
		sb, err := e.CreateSandbox(ctx, engine.CreateSandboxRequest{Language: "python", DiskMB: &disk})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}

	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			// Each attack gets a fresh sandbox: what a bomb leaves running in
			// the background (a finished command's processes may) must not
			// decide the next attack's outcome.
			attacker := newAttacker(t)
			defer func() {
				if _, err := e.TerminateSandbox(ctx, attacker.ID); err != nil {
					t.Errorf("terminate: %v", err)
				}
			}()
			argv := []string{"/bin/sh", "-c", a.sh}
			if a.py != "" {
				argv = []string{"python3", "-c", pyPrelude + a.py}
			}
			secs := a.secs
			if secs == 0 {
				secs = 20
			}
			res, err := e.Exec(ctx, engine.ExecRequest{SandboxID: attacker.ID, Argv: argv, TimeoutSeconds: &secs}, nil)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			out := res.Stdout + res.Stderr
			if strings.Contains(out, "rc=0") {
				t.Errorf("the attack's operation succeeded (rc=0):\n%.2000s", out)
			}
			for _, w := range a.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q (the attack may have worked):\nstdout: %.2000s\nstderr: %.2000s\ncause: %s %s", w, res.Stdout, res.Stderr, res.Termination.Cause, res.Termination.Detail)
				}
			}
			if a.cause != "" && res.Termination.Cause != a.cause {
				t.Errorf("cause %s (%s), want %s; stdout %.500q stderr %.500q", res.Termination.Cause, res.Termination.Detail, a.cause, res.Stdout, res.Stderr)
			}
			if a.syscal != "" && !blocked(res.BlockedSyscalls, a.syscal) {
				t.Errorf("blocked syscalls %+v do not name %s", res.BlockedSyscalls, a.syscal)
			}
			if left := sandboxProcs(t, attacker.ID, "sleep"); len(left) > 0 && strings.Contains(a.name, "setsid") {
				t.Errorf("processes survive the timeout: %v", left)
			}
		})
	}

	attacker := newAttacker(t)
	// Argument and environment bombs are refused before anything runs.
	huge := strings.Repeat("A", 200<<10)
	if _, err := e.Exec(ctx, engine.ExecRequest{SandboxID: attacker.ID, Argv: []string{"echo", huge}}, nil); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("huge argv: %v, want invalid_argument", err)
	}
	if _, err := e.Exec(ctx, engine.ExecRequest{SandboxID: attacker.ID, Argv: []string{"true"}, Env: map[string]string{"X": huge}}, nil); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("huge env: %v, want invalid_argument", err)
	}
	// Another sandbox's files are out of reach: no path leads there.
	res := mustExec(t, e, attacker.ID, "grep -rs "+canary+" / --exclude-dir=proc --exclude-dir=sys -l | head -3; echo searched")
	if strings.Contains(res.Stdout, "canary") {
		t.Errorf("the neighbour's canary is visible from the attacker: %s", res.Stdout)
	}

	// The daemon is healthy.
	for _, c := range e.Readiness(ctx) {
		if c.Required && c.Status != engine.CheckOK {
			t.Errorf("readiness %s: %s %s", c.Name, c.Status, c.Reason)
		}
	}
	// The neighbour is untouched: its file, its background process.
	res = mustExec(t, e, neighbour.ID, "cat /workspace/canary; grep -lx sleep /proc/[0-9]*/comm | wc -l")
	if res.Stdout != canary+"\n1\n" {
		t.Errorf("neighbour after the attacks: %q %q", res.Stdout, res.Stderr)
	}
	// And the attacker still works.
	if res := mustExec(t, e, attacker.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("attacker sandbox after the attacks: %q", res.Stdout)
	}
	host.check(t)
}

func mustExec(t *testing.T, e *engine.Engine, id, script string) *apitypes.ExecResult {
	t.Helper()
	secs := 60.0
	res, err := e.Exec(context.Background(), engine.ExecRequest{SandboxID: id, Command: script, TimeoutSeconds: &secs}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

func blocked(bs []apitypes.BlockedSyscall, name string) bool {
	for _, b := range bs {
		if b.Name == name && b.Count > 0 {
			return true
		}
	}
	return false
}

// cleanupEngine registers the end of a test's engine: every sandbox still
// live terminated, the engine closed, nothing of them left on the host.
func cleanupEngine(t *testing.T, e *engine.Engine, cfg *config.Config) {
	t.Cleanup(func() {
		ctx := context.Background()
		for _, id := range liveIDs(t, e) {
			if _, err := e.TerminateSandbox(ctx, id); err != nil {
				t.Errorf("terminate %s: %v", id, err)
			}
		}
		_ = e.Close()
		testenv.AssertNoLeftovers(t, cfg)
	})
}

func liveIDs(t *testing.T, e *engine.Engine) []string {
	list, err := e.ListSandboxes(context.Background(), "")
	if err != nil {
		t.Errorf("list sandboxes: %v", err)
		return nil
	}
	var ids []string
	for _, s := range list {
		if s.State != apitypes.StateTerminated && s.State != apitypes.StateFailed {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// sandboxProcs lists host pids of sandbox id's processes named comm.
func sandboxProcs(t *testing.T, id, comm string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, ent := range ents {
		cg, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/"+id) {
			continue
		}
		c, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "comm"))
		if strings.TrimSpace(string(c)) != comm {
			continue
		}
		// A zombie holds nothing but its pid until the sandbox's PID 1
		// reaps it; only live processes survive.
		if st, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat")); procState(st) == "Z" {
			continue
		}
		out = append(out, ent.Name())
	}
	return out
}

// procState is the state letter of a /proc/PID/stat line ("" if unknown);
// the command name before it may hold spaces and parentheses.
func procState(stat []byte) string {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// hostState is what the attacks must not change on the host.
type hostState struct {
	hostname, passwd, modules, sysrq string
	at                               time.Time
}

func snapshotHost(t *testing.T) *hostState {
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	return &hostState{
		hostname: read("/proc/sys/kernel/hostname"), passwd: read("/etc/passwd"),
		modules: read("/proc/modules"), sysrq: read("/proc/sys/kernel/sysrq"), at: time.Now(),
	}
}

func (h *hostState) check(t *testing.T) {
	now := snapshotHost(t)
	if now.hostname != h.hostname {
		t.Errorf("host hostname changed: %q → %q", h.hostname, now.hostname)
	}
	if now.modules != h.modules {
		t.Errorf("host kernel modules changed")
	}
	if now.sysrq != h.sysrq {
		t.Errorf("host sysrq changed")
	}
	if now.passwd != h.passwd {
		t.Errorf("host /etc/passwd changed")
	}
}
