//go:build chaos || soak

package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// rig is a real daemon whose network host side lives in a simulated host
// namespace (testenv.Topology), so that sandboxes with network can be made
// without touching the machine's own namespace.
type rig struct {
	t  *testing.T
	d  *testenv.Daemon
	tp *testenv.Topology
	// pid is the running daemon's, 0 while none runs.
	pid int
}

// newRig builds the topology and the daemon (not started); vms > 0 turns
// the VM backend on under TCG (software emulation, as on a CI machine).
func newRig(t *testing.T, vms int, images ...string) *rig {
	t.Helper()
	// The topology first: its cleanup (the namespaces) then runs after the
	// daemon's (which removes every sandbox and checks for leftovers).
	tp := testenv.NewTopology(t, "sbxk")
	d := testenv.NewDaemon(t, images...)
	d.Wrapper = []string{"nsenter", "--net=/run/netns/" + tp.Host}
	d.Config.VM.MaxVMs = vms
	d.Config.VM.Accel = "tcg"
	r := &rig{t: t, d: d, tp: tp}
	r.writeConfig()
	// Before the daemon's cleanup (which starts it again to remove every
	// sandbox): processes of a killed daemon left by a test that stopped
	// early would hold its state directory's lock and its sockets.
	t.Cleanup(func() { killSurvivors(r.survivors(r.pid)) })
	return r
}

func (r *rig) writeConfig() {
	data, err := config.Marshal(r.d.Config)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(r.d.CfgPath, data, 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// client is a REST client on the daemon's socket. A fresh one per daemon
// start: a kept-alive connection to a killed daemon would fail the first
// request of the next one (a POST is not retried).
func (r *rig) client() *client.Client {
	c, err := client.New(client.Options{Socket: r.d.Socket})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// start runs the daemon and returns how long after its start /readyz
// answered "ready" (0 and an error if it did not within limit).
func (r *rig) start(limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	r.d.Start() // waits for /healthz on the socket
	r.pid = r.d.PID()
	c := r.client()
	defer c.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rd, err := c.Readiness(ctx)
		cancel()
		el := time.Since(t0)
		if err == nil && rd.Status == client.StatusReady {
			return el, nil
		}
		if el > limit {
			return 0, fmt.Errorf("/readyz not ready %v after the daemon's start: %+v %v", el.Round(time.Millisecond), rd, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// survivor is a process of a killed daemon that is not a sandbox's.
type survivor struct {
	PID     int      `json:"pid"`
	PPID    int      `json:"ppid"`
	Cmdline string   `json:"cmdline"`
	Holds   []string `json:"holds"` // sockets and state files among its descriptors
}

func (s survivor) String() string {
	return fmt.Sprintf("pid %d (ppid %d) %q holding %v", s.PID, s.PPID, s.Cmdline, s.Holds)
}

// survivors lists the live processes, other than the running daemon
// (except pid) and the test, that carry this daemon's marks — its
// configuration file, state or run directory in their command line or
// environment — and do not run in a sandbox's cgroup (sandbox inits and
// agents, and the QEMU of a VM, are meant to outlive the daemon and be
// adopted). Marks, not names: a fork of the daemon without exec has the
// daemon's own command line.
func (r *rig) survivors(except int) []survivor {
	cfg := r.d.Config
	marks := []string{r.d.CfgPath, cfg.Paths.StateDir, cfg.Paths.RunDir}
	self := os.Getpid()
	var out []survivor
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid == except {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		i := strings.LastIndexByte(string(stat), ')')
		if err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		environ, _ := os.ReadFile(filepath.Join(dir, "environ"))
		marked := false
		for _, m := range marks {
			if strings.Contains(string(cmdline), m) || strings.Contains(string(environ), m) {
				marked = true
			}
		}
		if !marked || inCgroupUnder(pid, cfg.Sandbox.CgroupParent) {
			continue
		}
		s := survivor{PID: pid, Cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))}
		if f := strings.Fields(string(stat[i+2:])); len(f) > 1 {
			s.PPID, _ = strconv.Atoi(f[1])
		}
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err == nil && (strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, cfg.Paths.StateDir) || strings.HasPrefix(l, cfg.Paths.RunDir)) {
				s.Holds = append(s.Holds, fd.Name()+"→"+l)
			}
		}
		out = append(out, s)
	}
	return out
}

// inCgroupUnder reports whether pid runs in a cgroup below parent (in any
// hierarchy).
func inCgroupUnder(pid int, parent string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.LastIndexByte(line, ':'); i >= 0 && strings.HasPrefix(line[i+1:], parent+"/") {
			return true
		}
	}
	return false
}

// waitSurvivors gives processes of a killed daemon a moment to go (a
// parent-death signal is delivered asynchronously, a short helper may be
// finishing) and returns those still there after grace.
func (r *rig) waitSurvivors(grace time.Duration) []survivor {
	deadline := time.Now().Add(grace)
	for {
		s := r.survivors(0)
		if len(s) == 0 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killSurvivors ends survivors found by waitSurvivors (processes of the
// test's own daemon), so that the run can go on and the report says how
// often it happened.
func killSurvivors(ss []survivor) {
	for _, s := range ss {
		if p, err := os.FindProcess(s.PID); err == nil {
			_ = p.Kill()
		}
	}
}

// openStore opens the daemon's database (SQLite allows readers beside
// the daemon).
func (r *rig) openStore() *store.Store {
	st, err := store.Open(context.Background(), filepath.Join(r.d.Config.Paths.StateDir, "state.db"))
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// veths lists the sandbox veths in the simulated host, and whether the
// daemon's bridge is there.
func (r *rig) veths() (veths []string, bridge bool) {
	nh, err := netlink.NewHandleAt(r.tp.HostNS)
	if err != nil {
		r.t.Fatal(err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, l := range links {
		switch n := l.Attrs().Name; {
		case strings.HasPrefix(n, network.VethPrefix):
			veths = append(veths, n)
		case n == r.d.Config.Network.Bridge:
			bridge = true
		}
	}
	return veths, bridge
}

// nftElements reports whether the daemon's nftables table exists in the
// simulated host and how many elements its sets hold.
func (r *rig) nftElements() (bool, int) {
	c, err := nftables.New(nftables.WithNetNSFd(int(r.tp.HostNS)))
	if err != nil {
		r.t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, tb := range tables {
		if !strings.HasPrefix(tb.Name, network.DefaultTable) {
			continue
		}
		sets, err := c.GetSets(tb)
		if err != nil {
			r.t.Fatal(err)
		}
		n := 0
		for _, s := range sets {
			els, err := c.GetSetElements(s)
			if err != nil {
				r.t.Fatal(err)
			}
			n += len(els)
		}
		return true, n
	}
	return false, 0
}

// recorder is a testing.TB that counts and keeps the errors reported
// through it (testenv.AssertNoLeftovers reports each leftover as one) and
// passes them on.
type recorder struct {
	testing.TB
	msgs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.TB.Helper()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.TB.Errorf(format, args...)
}

// finalLeftovers stops the daemon (which must have no live sandbox left)
// and lists everything of it left on the host: testenv.AssertNoLeftovers'
// cgroups, mounts, state dirs, images and loop devices, plus veths, the
// bridge and nftables elements in the simulated host, database rows that
// hold resources (ledger, user namespace ranges, leases, port exposures),
// and processes (in the sandboxes' cgroups, or carrying the daemon's marks:
// QEMU, helpers, a user namespace owner). Each is also reported as an error.
func (r *rig) finalLeftovers() []string {
	t := r.t
	if err := r.d.Stop(); err != nil {
		t.Errorf("daemon stop: %v", err)
	}
	r.pid = 0
	rec := &recorder{TB: t}
	testenv.AssertNoLeftovers(rec, r.d.Config)
	left := rec.msgs
	add := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		t.Error(msg)
		left = append(left, msg)
	}
	if vs, br := r.veths(); len(vs) != 0 || br {
		add("veths left in the simulated host: %v (bridge left: %v)", vs, br)
	}
	if ok, n := r.nftElements(); ok {
		add("nftables table %s* left with %d set elements", network.DefaultTable, n)
	}
	st := r.openStore()
	defer st.Close()
	ctx := context.Background()
	if owners, err := st.LedgerOwners(ctx); err != nil || len(owners) != 0 {
		add("ledger owners left: %v %v", owners, err)
	}
	if ranges, err := st.IDRanges(ctx); err != nil || len(ranges) != 0 {
		add("user namespace ranges left: %v %v", ranges, err)
	}
	if ls, err := st.ListLeases(ctx); err != nil || len(ls) != 0 {
		add("network leases left: %v %v", ls, err)
	}
	if xs, err := st.ListPortExposures(ctx); err != nil || len(xs) != 0 {
		add("port exposures left: %v %v", xs, err)
	}
	if ps := testenv.ProcessesInCgroup(r.d.Config.Sandbox.CgroupParent); len(ps) != 0 {
		add("processes left in the sandboxes' cgroups: %v", ps)
	}
	if ss := r.waitSurvivors(2 * time.Second); len(ss) != 0 {
		add("processes of the daemon left after it stopped: %v", ss)
		killSurvivors(ss)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.d.Config.Paths.RunDir, "netns")); len(ents) != 0 {
		add("network namespace files left: %d", len(ents))
	}
	return left
}
