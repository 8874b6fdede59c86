package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
)

// sideBySide starts two daemons in one simulated host namespace, each with
// its own state, run dir, cgroup parent (testenv.Config), bridge and
// address range, as a developer's `make run` beside the system daemon.
func sideBySide(t *testing.T) (h *simulatedHost, a, b *testenv.Daemon) {
	t.Helper()
	h = newSimulatedHost(t)
	a, b = testenv.NewDaemon(t), testenv.NewDaemon(t)
	b.Config.Network.Subnet = "10.89.0.0/16"
	rewriteConfig(t, b)
	for _, d := range []*testenv.Daemon{a, b} {
		d.Wrapper = []string{"nsenter", "--net=/run/netns/" + h.name}
		d.Start()
	}
	return h, a, b
}

func rewriteConfig(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// hostObjects lists, by owner state directory, the host veths and the
// sandbox chains of the daemons' tables in the simulated host.
func (h *simulatedHost) hostObjects(t *testing.T, ds ...*testenv.Daemon) (veths, chains map[string][]string) {
	t.Helper()
	veths, chains = map[string][]string{}, map[string][]string{}
	nh, err := netlink.NewHandleAt(h.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Type() == "veth" && strings.HasPrefix(l.Attrs().Name, network.VethPrefix) {
			owner := strings.TrimPrefix(l.Attrs().Alias, hostclaim.MarkPrefix)
			veths[owner] = append(veths[owner], l.Attrs().Name)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h.ns)))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		table := network.TableName(d.Config.Network.Bridge)
		for _, ch := range all {
			if ch.Table.Name == table && strings.HasPrefix(ch.Name, "sb_") {
				chains[d.Config.Paths.StateDir] = append(chains[d.Config.Paths.StateDir], ch.Name)
			}
		}
		slices.Sort(chains[d.Config.Paths.StateDir])
		slices.Sort(veths[d.Config.Paths.StateDir])
	}
	return veths, chains
}

// TestTwoDaemonsSideBySide: while daemon B is killed with SIGKILL and
// restarted (reconcile, adoption and gc each time), daemon A beside it
// creates, execs in and removes sandboxes with network without a single
// failure; B's sandboxes are adopted every time; and each daemon's gc
// leaves the other's veths and rules alone.
func TestTwoDaemonsSideBySide(t *testing.T) {
	h, a, b := sideBySide(t)
	if ta, tb := network.TableName(a.Config.Network.Bridge), network.TableName(b.Config.Network.Bridge); ta == tb {
		t.Fatalf("both daemons use table %s", ta)
	}
	// B's sandboxes live across its restarts.
	var bIDs []string
	for range 2 {
		bIDs = append(bIDs, strings.TrimSpace(b.MustCtl("create", "--lang", "shell", "--network", "egress")))
	}
	// A sandbox of A's that stays, whose objects B's gc must not touch.
	aKeep := strings.TrimSpace(a.MustCtl("create", "--lang", "shell", "--network", "egress"))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	cycles, attempts := 0, 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		fail := func(format string, args ...any) {
			mu.Lock()
			failures = append(failures, fmt.Sprintf(format, args...))
			mu.Unlock()
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			attempts++
			mu.Unlock()
			out, errOut, code := a.Ctl("create", "--lang", "shell", "--network", "egress")
			if code != 0 {
				fail("create: exit %d: %s", code, errOut)
				continue
			}
			id := strings.TrimSpace(out)
			if out, errOut, code := a.Ctl("exec", id, "--", "echo", "ok"); code != 0 || strings.TrimSpace(out) != "ok" {
				fail("exec in %s: exit %d: %q %s", id, code, out, errOut)
			}
			if _, errOut, code := a.Ctl("rm", "-f", id); code != 0 {
				fail("rm %s: exit %d: %s", id, code, errOut)
			}
			mu.Lock()
			cycles++
			mu.Unlock()
		}
	}()

	const restarts = 6
	for i := range restarts {
		// A's loop starts a cycle or more between kills, whatever the load.
		for start := cyclesNow(&mu, &attempts); cyclesNow(&mu, &attempts) == start; {
			time.Sleep(20 * time.Millisecond)
		}
		b.Crash()
		b.Start()
		live := b.LiveIDs()
		for _, id := range bIDs {
			if !slices.Contains(live, id) {
				t.Errorf("restart %d: B's sandbox %s was not adopted (live: %v)", i+1, id, live)
			}
		}
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("A failed %d times while B was killed and restarted %d times:\n%s", len(failures), restarts, strings.Join(failures, "\n"))
	}
	if cycles < restarts {
		t.Errorf("A ran %d create/exec/rm cycles over %d restarts of B, want at least one each", cycles, restarts)
	}
	t.Logf("A: %d create/exec/rm cycles, %d failures, over %d kill -9 restarts of B", cycles, len(failures), restarts)

	// gc of each daemon leaves the other's objects: the veths and chains
	// of both are exactly as before each gc.
	beforeV, beforeC := h.hostObjects(t, a, b)
	for _, d := range []*testenv.Daemon{a, b} {
		if n := len(beforeV[d.Config.Paths.StateDir]); n == 0 {
			t.Fatalf("no veth marked as %s's before gc: %v", d.Config.Paths.StateDir, beforeV)
		}
	}
	for _, d := range []*testenv.Daemon{b, a} {
		d.MustCtl("gc")
		afterV, afterC := h.hostObjects(t, a, b)
		for _, o := range []*testenv.Daemon{a, b} {
			sd := o.Config.Paths.StateDir
			if !slices.Equal(afterV[sd], beforeV[sd]) || !slices.Equal(afterC[sd], beforeC[sd]) {
				t.Errorf("after gc of %s: %s's veths %v (were %v), chains %v (were %v)",
					d.Config.Paths.StateDir, sd, afterV[sd], beforeV[sd], afterC[sd], beforeC[sd])
			}
		}
	}
	for _, c := range []struct {
		d  *testenv.Daemon
		id string
	}{{a, aKeep}, {b, bIDs[0]}} {
		if out, errOut, code := c.d.Ctl("exec", c.id, "--", "echo", "ok"); code != 0 || strings.TrimSpace(out) != "ok" {
			t.Errorf("exec in %s after both gcs: exit %d: %q %s", c.id, code, out, errOut)
		}
	}
}

func cyclesNow(mu *sync.Mutex, n *int) int {
	mu.Lock()
	defer mu.Unlock()
	return *n
}

// TestCollidingDaemonRefused: a daemon whose configuration names a bridge,
// address range, run dir or cgroup parent a live daemon holds does not
// start, and says which setting collides and who holds it.
func TestCollidingDaemonRefused(t *testing.T) {
	h := newSimulatedHost(t)
	a := testenv.NewDaemon(t)
	a.Wrapper = []string{"nsenter", "--net=/run/netns/" + h.name}
	a.Start()
	owner := fmt.Sprintf("another mcp-sandboxd (pid %d, state dir %s)", a.PID(), a.Config.Paths.StateDir)
	for _, c := range []struct {
		setting string
		change  func(*config.Config)
	}{
		{"network.bridge", func(c *config.Config) {
			c.Network.Bridge, c.Network.Subnet = a.Config.Network.Bridge, "10.90.0.0/16"
		}},
		{"network.subnet", func(c *config.Config) {}}, // the default range, A's
		{"paths.run_dir", func(c *config.Config) {
			c.Paths.RunDir, c.Network.Subnet = a.Config.Paths.RunDir, "10.90.0.0/16"
			c.Server.Socket = filepath.Join(t.TempDir(), "api.sock")
		}},
		{"sandbox.cgroup_parent", func(c *config.Config) {
			c.Sandbox.CgroupParent, c.Network.Subnet = a.Config.Sandbox.CgroupParent, "10.90.0.0/16"
		}},
	} {
		t.Run(c.setting, func(t *testing.T) {
			cfg := testenv.Config(t, "e2e")
			cfg.Server.Socket = filepath.Join(cfg.Paths.RunDir, "api.sock")
			cfg.Server.HTTPAddr = ""
			c.change(cfg)
			out, err := runRefused(t, h, cfg)
			if err == nil {
				t.Fatalf("second daemon (%s as A's) started:\n%s", c.setting, out)
			}
			want := c.setting + ": "
			if !strings.Contains(out, want) || !strings.Contains(out, owner) || !strings.Contains(out, "give this daemon its own "+c.setting) {
				t.Fatalf("second daemon (%s as A's): %v; want its error to name %q and %q:\n%s", c.setting, err, want, owner, out)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, owner) {
					t.Logf("refused: %s", l)
				}
			}
		})
	}
	// A is untouched: it still makes sandboxes with network.
	id := strings.TrimSpace(a.MustCtl("create", "--lang", "shell", "--network", "egress"))
	a.MustCtl("exec", id, "--", "true")
}

// runRefused runs `mcp-sandboxd serve` on cfg in the simulated host and
// returns its output once it exits (an error: it was refused), or an
// empty error and what it said if it still ran after its start-up time.
func runRefused(t *testing.T, h *simulatedHost, cfg *config.Config) (string, error) {
	t.Helper()
	data, err := config.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mcp-sandboxd.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+h.name, filepath.Join(testenv.BinDir(t), "mcp-sandboxd"), "serve", "--config", path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// A refusal comes before anything is served; a daemon that answers
	// on its socket was not refused. The bound is only against a hang: a
	// start takes seconds, a refusal less.
	deadline := time.After(3 * time.Minute)
	for {
		select {
		case err := <-done:
			return out.String(), err
		case <-deadline:
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("second daemon neither refused nor served within 3 minutes:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := os.Stat(cfg.Server.Socket); err == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			return out.String(), nil
		}
	}
}
