package network

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// TestTwoManagersOwnTheirObjects: two daemons' managers in one host
// namespace, each with its own bridge, range, table and leases. gc of one
// with nothing live removes all of its own pieces and none of the other's,
// whose sandbox keeps its network; a manager naming the other's bridge or
// range is refused naming the setting; one whose bridge and table carry
// another daemon's mark (that daemon gone, its sandbox alive) is refused.
func TestTwoManagersOwnTheirObjects(t *testing.T) {
	tp := newTopology(t)
	ctx := context.Background()
	mA := tp.manager(t, nil)
	aCfg := tp.config()
	storeB, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	must(t, err)
	t.Cleanup(func() { storeB.Close() })
	bCfg := tp.config()
	bCfg.Bridge, bCfg.Subnet, bCfg.RunDir = "sbxb", netip.MustParsePrefix("10.89.0.0/16"), filepath.Join(tp.dir, "runB")
	mB, err := New(bCfg, tp.hostNS, storeB)
	must(t, err)
	if mA.Table() == mB.Table() || mA.Table() != DefaultTable || mB.Table() != DefaultTable+"_sbxb" {
		t.Fatalf("tables %s and %s, want %s and %s_sbxb", mA.Table(), mB.Table(), DefaultTable, DefaultTable)
	}

	a := attach(t, mA, "sb-own-a", Request{Policy: Policy{Mode: ModeEgress}})
	if _, err := mB.Attach(ctx, "sb-own-b", Request{Policy: Policy{Mode: ModeEgress}}, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := mB.GC(ctx, func(string) bool { return false })
	must(t, err)
	if !slices.Equal(rep.Veths, []string{hostVethName("sb-own-b")}) || !slices.Equal(rep.Rules, []string{sandboxKey("sb-own-b")}) || !rep.HostSide {
		t.Errorf("gc of B: %+v, want exactly B's veth %s, rules %s and host side", rep, hostVethName("sb-own-b"), sandboxKey("sb-own-b"))
	}
	mB.Close()
	h, err := netlink.NewHandleAt(tp.hostNS)
	must(t, err)
	defer h.Close()
	veth, err := h.LinkByName(hostVethName("sb-own-a"))
	if err != nil || veth.Attrs().Alias != hostclaim.Mark(aCfg.RunDir) {
		t.Fatalf("A's veth after B's gc: %v %v, want it marked %q", veth, err, hostclaim.Mark(aCfg.RunDir))
	}
	if keys, err := mA.fw.sandboxKeys(); err != nil || !slices.Equal(keys, []string{sandboxKey("sb-own-a")}) {
		t.Fatalf("A's rules after B's gc: %v %v", keys, err)
	}
	if _, err := get(t, a, upstreamAddr1, "/", 3*time.Second); err != nil {
		t.Fatalf("A's sandbox after B's gc: %v", err)
	}

	// A is live: its bridge and range are claimed.
	for _, c := range []struct {
		setting string
		mutate  func(*Config)
	}{
		{"network.bridge", func(c *Config) { c.Subnet = netip.MustParsePrefix("10.90.0.0/16") }},
		{"network.subnet", func(c *Config) { c.Bridge = "sbxc" }},
	} {
		cfg := tp.config()
		cfg.RunDir = filepath.Join(tp.dir, "runC")
		c.mutate(&cfg)
		m, err := New(cfg, tp.hostNS, storeB)
		var inUse *hostclaim.InUseError
		if !errors.As(err, &inUse) || inUse.Setting != c.setting || inUse.PID != os.Getpid() {
			if m != nil {
				m.Close()
			}
			t.Fatalf("manager on A's %s: %v, want an InUseError of %s naming pid %d", c.setting, err, c.setting, os.Getpid())
		}
	}

	// A gone (no Detach, as after kill -9), its sandbox alive: a daemon of
	// another state on A's bridge finds A's marks and is refused.
	mA.Close()
	cfg := tp.config()
	cfg.RunDir = filepath.Join(tp.dir, "runC")
	m, err := New(cfg, tp.hostNS, storeB)
	var marked *hostclaim.MarkedError
	if !errors.As(err, &marked) || marked.Mark != hostclaim.Mark(aCfg.RunDir) || marked.Setting != "network.bridge" {
		if m != nil {
			m.Close()
		}
		t.Fatalf("manager on dead A's marked bridge: %v, want a MarkedError naming %q", err, hostclaim.Mark(aCfg.RunDir))
	}
	// A again (restarted) adopts its sandbox; tp.manager's cleanup then
	// removes it all.
	mA2 := tp.manager(t, nil)
	if _, err := mA2.Attach(ctx, "sb-own-a", Request{Policy: Policy{Mode: ModeEgress}}, nil); err != nil {
		t.Fatalf("A restarted: %v", err)
	}
	if _, err := get(t, a, upstreamAddr1, "/", 3*time.Second); err != nil {
		t.Fatalf("A's sandbox after A's restart: %v", err)
	}
}

// TestUnmarkedHostSideAdopted: a bridge and table made by a daemon older
// than the marks are adopted (marked as ours) by the default-named daemon.
func TestUnmarkedHostSideAdopted(t *testing.T) {
	tp := newTopology(t)
	cfg := tp.config()
	// The old daemon's host side: its bridge and table, no marks.
	h, err := netlink.NewHandleAt(tp.hostNS)
	must(t, err)
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = cfg.Bridge
	must(t, h.LinkAdd(&netlink.Bridge{LinkAttrs: la}))
	old := newFirewall(tp.hostNS, cfg.Bridge, "")
	gw := cfg.Subnet.Addr().Next()
	must(t, old.install(gw, cfg.Subnet, "uplink0", cfg.Deny, 0))
	c, err := old.conn()
	must(t, err)
	ch := &nftables.Chain{Name: chainOwner, Table: old.table}
	c.FlushChain(ch)
	c.DelChain(ch)
	must(t, c.Flush())
	if _, exists, err := old.owner(); err != nil || !exists {
		t.Fatalf("old table: exists %v, %v", exists, err)
	}

	m := tp.manager(t, nil)
	attach(t, m, "sb-adopt", Request{Policy: Policy{Mode: ModeEgress}})
	br, err := h.LinkByName(cfg.Bridge)
	must(t, err)
	if br.Attrs().Alias != m.mark {
		t.Errorf("adopted bridge's alias %q, want %q", br.Attrs().Alias, m.mark)
	}
	if mark, exists, err := m.fw.owner(); err != nil || !exists || mark != m.mark {
		t.Errorf("adopted table: owner %q exists %v (%v), want %q", mark, exists, err, m.mark)
	}
}

// TestDefaultBridgeKeepsTable: the configuration's default bridge is the
// one whose table keeps the name every daemon used before (an upgrade
// adopts its sandboxes); any other bridge gets a table of its own.
func TestDefaultBridgeKeepsTable(t *testing.T) {
	if b := config.Default().Network.Bridge; b != DefaultBridge || TableName(b) != DefaultTable {
		t.Fatalf("default bridge %q: table %q, want %q", b, TableName(b), DefaultTable)
	}
	if n := TableName("sbxdev0"); n != DefaultTable+"_sbxdev0" {
		t.Fatalf("TableName(sbxdev0) = %q", n)
	}
}
