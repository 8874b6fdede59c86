package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// simulatedHost is testenv's simulated host namespace (with its uplink to
// an upstream namespace holding its default route), so that the daemon's
// bridge, NAT table and ip_forward are the test's own; the machine's root
// namespace is never touched.
type simulatedHost struct {
	name    string
	ns      netns.NsHandle
	forward string // ip_forward as the namespace was built
}

func newSimulatedHost(t *testing.T) *simulatedHost {
	t.Helper()
	tp := testenv.NewTopology(t, "sbxc")
	return &simulatedHost{name: tp.Host, ns: tp.HostNS, forward: tp.Forward}
}

// veths lists the sandbox veths (and the bridge, if any) in the namespace.
func (h *simulatedHost) links(t *testing.T, bridge string) []string {
	t.Helper()
	nh, err := netlink.NewHandleAt(h.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, network.VethPrefix) || n == bridge {
			out = append(out, n)
		}
	}
	return out
}

// table reports whether our nftables table exists in the namespace, and
// how many elements its sets hold.
func (h *simulatedHost) table(t *testing.T) (bool, int) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(h.ns)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if !strings.HasPrefix(tb.Name, network.DefaultTable) {
			continue
		}
		sets, err := c.GetSets(tb)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range sets {
			els, err := c.GetSetElements(s)
			if err != nil {
				t.Fatal(err)
			}
			n += len(els)
		}
		return true, n
	}
	return false, 0
}

// ipForward reads net.ipv4.ip_forward of the namespace (/proc/sys/net shows
// the namespace of the reading process).
func (h *simulatedHost) ipForward(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/run/netns/"+h.name, "cat", "/proc/sys/net/ipv4/ip_forward").CombinedOutput()
	if err != nil {
		t.Fatalf("read ip_forward: %v %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// leases lists the network leases in the daemon's database.
func leases(t *testing.T, d *testenv.Daemon) []store.Lease {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(d.Config.Paths.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ls, err := st.ListLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// TestKillDaemonWhileCreatingNetworkSandboxes: a real daemon whose host side
// lives in a simulated host namespace is killed (SIGKILL) while it creates
// 30 sandboxes with network (egress, and allowlists with a CIDR: set
// elements) five at a time. After a restart (which adopts every sandbox
// whose create answered and fails the half-made ones), the creation of the
// rest of the 30, their removal and gc, no veth, bridge, namespace file, lease, set element or table is
// left, and ip_forward is back to the value the host started with.
func TestKillDaemonWhileCreatingNetworkSandboxes(t *testing.T) {
	h := newSimulatedHost(t)
	d := testenv.NewDaemon(t)
	d.Wrapper = []string{"nsenter", "--net=/run/netns/" + h.name}
	d.Start()
	bridge := d.Config.Network.Bridge
	if v := h.ipForward(t); v != h.forward {
		t.Fatalf("ip_forward of the simulated host after the daemon started: %s, it started with %s", v, h.forward)
	}

	const total, workers, crashAfter = 30, 5, 12
	var created, inflight atomic.Int32
	crashed := make(chan struct{})
	var crashOnce sync.Once
	var inflightAtCrash int32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string // sandboxes whose create answered
	next := make(chan int, total)
	for i := range total {
		next <- i
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				select {
				case <-crashed:
					return
				default:
				}
				args := []string{"create", "--lang", "shell", "--network", "egress"}
				if i%2 == 1 {
					args = []string{"create", "--lang", "shell", "--network", "allowlist", "--allow", "198.51.100.0/24", "--allow", fmt.Sprintf("203.0.113.%d/32", i)}
				}
				inflight.Add(1)
				out, _, code := d.Ctl(args...)
				inflight.Add(-1)
				if code == 0 {
					mu.Lock()
					ids = append(ids, strings.TrimSpace(out))
					mu.Unlock()
				}
				if code == 0 && created.Add(1) >= crashAfter {
					crashOnce.Do(func() {
						// The kill comes while the other workers' creates run.
						inflightAtCrash = inflight.Load()
						for range 20 {
							if inflightAtCrash > 0 {
								break
							}
							time.Sleep(5 * time.Millisecond)
							inflightAtCrash = inflight.Load()
						}
						// Pieces of the sandboxes are on the simulated host now.
						if l := h.links(t, bridge); len(l) < crashAfter {
							t.Errorf("links before the kill: %v, want a veth per sandbox", l)
						}
						if v := h.ipForward(t); v != "1" {
							t.Errorf("ip_forward with network sandboxes: %s, want 1", v)
						}
						d.Crash()
						close(crashed)
					})
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-crashed:
	default:
		t.Fatalf("only %d of %d creates succeeded; the daemon was never killed\n%s", created.Load(), total, d.Log())
	}
	t.Logf("killed after %d creates with %d in flight", created.Load(), inflightAtCrash)
	if inflightAtCrash == 0 {
		t.Errorf("no create was in flight when the daemon was killed")
	}

	d.Start()
	// Every sandbox whose create answered was adopted; the ones killed
	// half-made were reconciled as failed. A create in flight may also
	// have finished in the store just before the kill, its answer lost
	// with the daemon: it is adopted too, so at most the in-flight
	// creates add to the answered ones, and nothing answered is lost.
	live := d.LiveIDs()
	slices.Sort(live)
	slices.Sort(ids)
	for _, id := range ids {
		if !slices.Contains(live, id) {
			t.Errorf("sandbox %s, whose create answered, is not live after the restart (live: %v)", id, live)
		}
	}
	if extra := len(live) - len(ids); extra < 0 || extra > int(inflightAtCrash) {
		t.Errorf("live after restart: %v; the created %v and at most %d finished in flight", live, ids, inflightAtCrash)
	}
	adopted := len(live)
	var all []struct {
		ID    string `json:"sandbox_id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("ps", "--all", "--json")), &all); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, s := range all {
		if s.State == "failed" {
			failed++
		}
	}
	t.Logf("after restart: %d adopted, %d failed (killed half-made), %d in all", len(live), failed, len(all))
	// The adopted allowlists' addresses are back in the table's sets.
	if ok, n := h.table(t); !ok || n == 0 {
		t.Errorf("after restart: table exists=%v with %d set elements, want the adopted allowlists'", ok, n)
	}
	// The rest of the 30 are created by the restarted daemon.
	for i := len(all); i < total; i++ {
		args := []string{"create", "--lang", "shell", "--network", "egress"}
		if i%2 == 1 {
			args = []string{"create", "--lang", "shell", "--network", "allowlist", "--allow", "198.51.100.0/24"}
		}
		d.MustCtl(args...)
	}
	live = d.LiveIDs()
	if len(live) != adopted+total-len(all) {
		t.Errorf("%d live sandboxes, want %d", len(live), adopted+total-len(all))
	}
	for _, id := range live {
		d.MustCtl("rm", "-f", id)
	}
	d.MustCtl("gc")

	if l := h.links(t, bridge); len(l) != 0 {
		t.Errorf("links left: %v", l)
	}
	if ok, n := h.table(t); ok || n != 0 {
		t.Errorf("nftables table left (exists=%v, %d set elements)", ok, n)
	}
	if v := h.ipForward(t); v != h.forward {
		t.Errorf("ip_forward = %s, want %s restored (the value it started with)", v, h.forward)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.Config.Paths.RunDir, "netns")); len(entries) != 0 {
		t.Errorf("namespace files left: %d", len(entries))
	}
	if ls := leases(t, d); len(ls) != 0 {
		t.Errorf("leases left: %v", ls)
	}
}
