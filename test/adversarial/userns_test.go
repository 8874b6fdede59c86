package adversarial

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"golang.org/x/sys/unix"
)

// inotifyHog takes inotify instances until the kernel refuses one, reports
// how many it got, and holds them.
const inotifyHog = `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init() >= 0:
    n += 1
open('/workspace/hog.tmp', 'w').write('%d %d' % (n, ctypes.get_errno()))
os.rename('/workspace/hog.tmp', '/workspace/hog')
time.sleep(600)
`

const inotifyOne = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print('inotify_init:', 'ok' if fd >= 0 else 'errno %d' % ctypes.get_errno())
`

// TestUserNamespaces: every sandbox runs as its own unprivileged host ids,
// per-uid kernel limits stop at the sandbox, and root mode is root inside
// only.
func TestUserNamespaces(t *testing.T) {
	cfg := testenv.Config(t, "userns")
	testenv.EnsureImages(t, "python")
	ctx := context.Background()
	// Root mode installs from a Debian mirror: the engine's network host
	// side lives in a simulated host namespace whose upstream serves the
	// mirror (pkg.example.test, by the upstream's DNS server).
	tp := testenv.NewTopology(t, "sbxa")
	tp.ServeDNS(t, map[string]string{mirrorHost + ".": testenv.UpstreamAddr})
	cfg.Network.DNS = []string{testenv.UpstreamAddr}
	var e *engine.Engine
	var err error
	testenv.InNamespace(t, tp.HostNS, func() { e, err = engine.New(ctx, cfg, testenv.Logger(t)) })
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last registered first: this check after cleanupEngine's.
	t.Cleanup(func() {
		// Every range went back to the pool with its sandbox.
		db, err := sql.Open("sqlite", "file:"+filepath.Join(cfg.Paths.StateDir, "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var held int
		if err := db.QueryRow("SELECT COUNT(*) FROM userns_ranges").Scan(&held); err != nil || held != 0 {
			t.Errorf("id ranges still held after every sandbox ended: %d (%v)", held, err)
		}
	})
	cleanupEngine(t, e, cfg)
	create := func(req engine.CreateSandboxRequest) *apitypes.Sandbox {
		req.Language = "python"
		sb, err := e.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	// r may reach the mirror and nothing else.
	a, b := create(engine.CreateSandboxRequest{}), create(engine.CreateSandboxRequest{})
	r := create(engine.CreateSandboxRequest{Root: true, Network: engine.NetworkAllowlist, Allow: []string{mirrorHost}})
	pool := cfg.Sandbox.UsernsPool
	accounts := hostIDs(t, "/etc/passwd")

	// hostUIDs returns the host uids (real, effective, saved, fs) of the
	// sandbox's agent and of a process started in it.
	hostUIDs := func(sb *apitypes.Sandbox) map[string][]int {
		mustExec(t, e, sb.ID, "(setsid sleep 300 &)")
		out := map[string][]int{}
		for _, comm := range []string{"agent", "sleep"} {
			pids := sandboxProcs(t, sb.ID, comm)
			if len(pids) == 0 {
				t.Fatalf("%s: no %s process found from the host", sb.ID, comm)
			}
			out[comm] = statusIDs(t, pids[0], "Uid:")
		}
		return out
	}
	seen := map[int]string{}
	for _, c := range []struct {
		sb       *apitypes.Sandbox
		insideID int // uid of commands inside
	}{{a, cfg.Sandbox.User}, {b, cfg.Sandbox.User}, {r, 0}} {
		ids := hostUIDs(c.sb)
		agent, cmd := ids["agent"][0], ids["sleep"][0]
		for _, u := range append(ids["agent"], ids["sleep"]...) {
			if u < int(pool.Base) || u >= int(pool.Base+pool.Size*pool.Count) {
				t.Errorf("%s: host uid %d is outside the pool [%d, %d)", c.sb.ID, u, pool.Base, pool.Base+pool.Size*pool.Count)
			}
			if name, ok := accounts[u]; ok {
				t.Errorf("%s: host uid %d is the account %s of /etc/passwd", c.sb.ID, u, name)
			}
		}
		// The range starts at the sandbox's root (the agent).
		if cmd-agent != c.insideID || (agent-int(pool.Base))%int(pool.Size) != 0 {
			t.Errorf("%s: agent runs as host uid %d, a command as %d: want a range start and start+%d", c.sb.ID, agent, cmd, c.insideID)
		}
		if other, dup := seen[agent]; dup {
			t.Errorf("%s and %s share host uid %d", c.sb.ID, other, agent)
		}
		seen[agent] = c.sb.ID
		t.Logf("%s: agent host uid %d, command host uid %d (inside %d)", c.sb.ID, agent, cmd, c.insideID)
	}

	// No other host user reaches a sandbox's files through the host paths
	// its init walks (they are in /proc/mounts for everyone to read).
	for _, rel := range []string{"layers/rootfs/etc/hostname", "disk/workspace"} {
		p := filepath.Join(cfg.Paths.RunDir, "sandboxes", a.ID, rel)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("host root: %v", err)
		}
		cmd := exec.Command("stat", p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
			t.Errorf("host user nobody: stat %s: %v %s, want permission denied", p, err, out)
		}
	}

	// Root mode: uid 0 inside, with the capabilities of that namespace only.
	res := mustExec(t, e, r.ID, "id -u; echo x > /etc/written-by-root && echo wrote; cat /etc/shadow > /dev/null && echo shadow-readable; mknod /tmp/sda b 8 0 2>&1; echo mknod=$?")
	if !strings.HasPrefix(res.Stdout, "0\nwrote\nshadow-readable\n") || !strings.Contains(res.Stdout, "mknod=1") {
		t.Errorf("root mode: %q %q, want uid 0 that writes /etc and reads its own image's /etc/shadow, but cannot make devices", res.Stdout, res.Stderr)
	}
	// Root mode installs packages from a Debian mirror with apt-get.
	aptFromMirror(t, tp, e, r)
	if res := mustExec(t, e, a.ID, "id -u"); res.Stdout != strconv.Itoa(cfg.Sandbox.User)+"\n" {
		t.Errorf("default mode: id -u = %q", res.Stdout)
	}

	// Per-uid limits: a holding every inotify instance it can get leaves b,
	// and the host's root, theirs.
	go func() {
		secs := 120.0
		_, _ = e.Exec(ctx, engine.ExecRequest{SandboxID: a.ID, Argv: []string{"python3", "-c", inotifyHog}, TimeoutSeconds: &secs}, nil)
	}()
	var got string
	for deadline := time.Now().Add(30 * time.Second); got == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		res := mustExec(t, e, a.ID, "cat /workspace/hog 2>/dev/null || true")
		got = res.Stdout
	}
	n, _ := strconv.Atoi(strings.Fields(got + " 0")[0])
	if n == 0 {
		t.Fatalf("the inotify hog did not report (%q)", got)
	}
	t.Logf("the hog holds %d inotify instances (then %s)", n, got)
	if max := readInt(t, "/proc/sys/fs/inotify/max_user_instances"); n < max {
		t.Errorf("the hog got %d instances, fewer than max_user_instances %d: the attack did not exhaust its limit", n, max)
	}
	res, err = e.Exec(ctx, engine.ExecRequest{SandboxID: b.ID, Argv: []string{"python3", "-c", inotifyOne}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "inotify_init: ok\n" {
		t.Errorf("the neighbour after the inotify hog: %q %q", res.Stdout, res.Stderr)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("host root after the inotify hog: inotify_init: %v", err)
	} else {
		unix.Close(fd)
	}
}

// statusIDs returns the four ids of a /proc/PID/status line ("Uid:").
func statusIDs(t *testing.T, pid, key string) []int {
	t.Helper()
	ids, err := procIDs(pid, key)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// hostIDs maps the ids of a passwd-format file to their names.
func hostIDs(t *testing.T, file string) map[int]string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) > 2 {
			if id, err := strconv.Atoi(f[2]); err == nil {
				out[id] = f[0]
			}
		}
	}
	return out
}

func readInt(t *testing.T, p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
