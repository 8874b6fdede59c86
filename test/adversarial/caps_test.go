package adversarial

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// Capability sets per mode (pkg/runtime.AgentCapabilities and
// RootModeCapabilities) as /proc/PID/status shows them.
const (
	// KILL (5), SETGID (6), SETUID (7), SETPCAP (8).
	capsNormalAgent = "CapInh: 0000000000000000 CapPrm: 00000000000001e0 CapEff: 00000000000001e0 CapBnd: 00000000000001e0 CapAmb: 0000000000000000 NoNewPrivs: 1"
	capsNone        = "CapInh: 0000000000000000 CapPrm: 0000000000000000 CapEff: 0000000000000000 CapBnd: 0000000000000000 CapAmb: 0000000000000000 NoNewPrivs: 1"
	// CHOWN (0), DAC_OVERRIDE (1), FOWNER (3), FSETID (4), KILL (5),
	// SETGID (6), SETUID (7), SETPCAP (8), NET_BIND_SERVICE (10),
	// SYS_CHROOT (18).
	capsRoot = "CapInh: 0000000000000000 CapPrm: 00000000000405fb CapEff: 00000000000405fb CapBnd: 00000000000405fb CapAmb: 0000000000000000 NoNewPrivs: 1"
)

// TestCapabilitiesPerMode checks the exact capability sets of the agent
// (PID 1) and of a command in normal and in root mode, on the spare
// helper's path and on the direct one (a command message over 64 KiB does
// not fit the spare), and that root mode's set does what it is there for
// while normal mode's commands can do none of it.
func TestCapabilitiesPerMode(t *testing.T) {
	cfg := testenv.Config(t, "caps")
	testenv.EnsureImages(t, "python")
	ctx := context.Background()
	e, err := engine.New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	cleanupEngine(t, e, cfg)
	create := func(root bool) *apitypes.Sandbox {
		sb, err := e.CreateSandbox(ctx, engine.CreateSandboxRequest{Language: "python", Root: root})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	hostPortStart := hostSysctl(t, "net/ipv4/ip_unprivileged_port_start")
	normal, root := create(false), create(true)

	capsOf := "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/%s/status | tr -s '\\t' ' ' | tr '\\n' ' '"
	big := strings.Repeat("x", 30<<10)
	for _, c := range []struct {
		mode       string
		sb         *apitypes.Sandbox
		agent, job string
	}{{"normal", normal, capsNormalAgent, capsNone}, {"root", root, capsRoot, capsRoot}} {
		for _, pid := range []string{"1", "self"} {
			want := c.job
			if pid == "1" {
				want = c.agent
			}
			for _, env := range []map[string]string{nil, {"BIG1": big, "BIG2": big, "BIG3": big}} {
				res, err := e.Exec(ctx, engine.ExecRequest{SandboxID: c.sb.ID, Argv: []string{"sh", "-c", fmt.Sprintf(capsOf, pid)}, Env: env}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.TrimSpace(res.Stdout); got != want {
					t.Errorf("%s mode: /proc/%s/status (%d large env vars): %q (stderr %q), want %q", c.mode, pid, len(env), got, res.Stderr, want)
				}
			}
		}
	}

	// Root mode's set at work: chroot (the seccomp profile is resolved
	// for root mode's set), dpkg unpacking a setgid file of another user
	// and group (CHOWN, and FSETID: root is not in group 50). Normal
	// mode's commands can do none of it. Both bind port 80 without any
	// capability: the sandbox's own network namespace (here libcontainer's
	// new one, written by the sandbox's init through the spec's sysctls)
	// has ip_unprivileged_port_start 0, as Docker sets it.
	probe := `cat /proc/sys/net/ipv4/ip_unprivileged_port_start; python3 -c "
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(('127.0.0.1', 80)); print('bind80 ok')
except OSError as e:
    print('bind80 errno', e.errno)
try:
    os.chroot('/tmp'); print('chroot ok')
except OSError as e:
    print('chroot errno', e.errno)
"`
	if res := mustExec(t, e, root.ID, probe); res.Stdout != "0\nbind80 ok\nchroot ok\n" {
		t.Errorf("root mode: %q %q, want port start 0, a port below 1024 and chroot", res.Stdout, res.Stderr)
	}
	if res := mustExec(t, e, normal.ID, probe); res.Stdout != "0\nbind80 ok\nchroot errno 1\n" {
		t.Errorf("normal mode: %q %q, want port start 0, port 80 bound without capabilities and EPERM from chroot", res.Stdout, res.Stderr)
	}
	if got := hostSysctl(t, "net/ipv4/ip_unprivileged_port_start"); got != hostPortStart {
		t.Errorf("the host's ip_unprivileged_port_start went from %s to %s", hostPortStart, got)
	}
	res := mustExec(t, e, root.ID, `set -e; d=/tmp/pkg; mkdir -p $d/DEBIAN $d/usr/local/lib/sbx-owned
printf 'Package: sbx-owned\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n' > $d/DEBIAN/control
echo x > $d/usr/local/lib/sbx-owned/f; chown -R 0:0 $d; chown 1000:50 $d/usr/local/lib/sbx-owned/f; chmod 2755 $d/usr/local/lib/sbx-owned/f
dpkg-deb --build $d /tmp/sbx-owned.deb >/dev/null; rm -rf $d
dpkg -i /tmp/sbx-owned.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; exit 1; }
stat -c '%u %g %a' /usr/local/lib/sbx-owned/f`)
	if res.Stdout != "1000 50 2755\n" {
		t.Errorf("root mode: dpkg -i of a setgid file owned by 1000:50: exit %d %q %q, want it unpacked as 1000 50 2755", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// hostSysctl reads a /proc/sys file of the test's own namespaces (the
// host's); the tests only compare it before and after, never write it.
func hostSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
