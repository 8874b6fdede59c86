package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func attach(t testing.TB, m *Manager, id string, req Request) *Attachment {
	t.Helper()
	a, err := m.Attach(context.Background(), id, req, nil)
	if err != nil {
		t.Fatalf("attach %s: %v", id, err)
	}
	t.Cleanup(func() {
		if err := m.Detach(context.Background(), id); err != nil {
			t.Errorf("detach %s: %v", id, err)
		}
	})
	return a
}

func TestEgressMasqueradeAndDeny(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	a := attach(t, m, "sb-egress", Request{Policy: Policy{Mode: ModeEgress}})
	b := attach(t, m, "sb-other", Request{Policy: Policy{Mode: ModeEgress}})

	if !strings.Contains(string(a.ResolvConf), "nameserver "+a.Gateway.String()) {
		t.Fatalf("resolv.conf = %q, want the gateway", a.ResolvConf)
	}
	rcode, addrs := resolve(t, a, "pkg.example.test")
	if rcode != dns.RcodeSuccess || !slices.Equal(addrs, []string{upstreamAddr1}) {
		t.Fatalf("resolve pkg.example.test: rcode %d, %v", rcode, addrs)
	}
	body, err := get(t, a, addrs[0], "/", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if body != "client="+hostUplinkAddr {
		t.Fatalf("upstream saw %q, want the host's uplink address (masquerade)", body)
	}

	// IPv6 is off inside the sandbox.
	ans, err := netns.GetFromPath(a.NetNSPath)
	must(t, err)
	defer ans.Close()
	if v, err := readSysctl(ans, "net/ipv6/conf/all/disable_ipv6"); err != nil || v != "1" {
		t.Fatalf("disable_ipv6 in the sandbox = %q (%v), want 1", v, err)
	}
	// Low ports are the sandbox's in its own namespace (SandboxSysctls);
	// the host namespace keeps the kernel's default.
	if v, err := readSysctl(ans, "net/ipv4/ip_unprivileged_port_start"); err != nil || v != "0" {
		t.Fatalf("ip_unprivileged_port_start in the sandbox = %q (%v), want 0", v, err)
	}
	if v, err := readSysctl(tp.hostNS, "net/ipv4/ip_unprivileged_port_start"); err != nil || v != "1024" {
		t.Fatalf("ip_unprivileged_port_start of the host namespace = %q (%v), want 1024 untouched", v, err)
	}

	// The deny list, wherever the route leads.
	dialFails(t, a, upstreamDenied+":80", true)
	// The host's own addresses: its uplink address and the gateway.
	listen(t, tp.hostNS, "0.0.0.0:8080")
	dialFails(t, a, hostUplinkAddr+":8080", true)
	dialFails(t, a, a.Gateway.String()+":8080", true)
	// Another sandbox, listening.
	bns, err := netns.GetFromPath(b.NetNSPath)
	must(t, err)
	defer bns.Close()
	listen(t, bns, "0.0.0.0:8080")
	dialFails(t, a, b.IP.String()+":8080", false)
	// Nothing opens a connection into a sandbox, not even the host.
	err = InNetNS(tp.hostNS, func() error {
		c, err := (&netDialer{timeout: 700 * time.Millisecond}).dial(b.IP.String() + ":8080")
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("the host opened a connection into a sandbox")
	}

	st, err := m.Status("sb-egress")
	must(t, err)
	if st.Mode != ModeEgress || st.Counters.Allowed < 1 || st.Counters.Denied < 1 ||
		!slices.Contains(st.Counters.DeniedDestinations, upstreamDenied) {
		t.Fatalf("status = %+v, want allowed and denied counted and %s among the denied", st, upstreamDenied)
	}
}

func TestNoneIsLoopbackOnly(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	a := attach(t, m, "sb-none", Request{})
	if a.IP.IsValid() || a.NetNSPath == "" {
		t.Fatalf("attachment = %+v, want a namespace and no address", a)
	}
	ns, err := netns.GetFromPath(a.NetNSPath)
	must(t, err)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	must(t, err)
	defer h.Close()
	links, err := h.LinkList()
	must(t, err)
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in a none sandbox: %v, want only lo", linkNames(links))
	}
	start := time.Now()
	err = inSandbox(t, a, func() error {
		c, err := (&netDialer{timeout: 3 * time.Second}).dial(upstreamAddr1 + ":80")
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("connect from a none sandbox: %v after %v, want an immediate failure", err, time.Since(start))
	}
	// The host side is not even up for a none sandbox.
	if _, err := m.host.LinkByName("sbx0"); err == nil {
		t.Fatal("bridge exists with only a none sandbox")
	}
}

func linkNames(ls []netlink.Link) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name)
	}
	return out
}

func TestAllowlist(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	a := attach(t, m, "sb-allow", Request{Policy: Policy{Mode: ModeAllowlist, Allow: []string{"@testidx"}}})

	for name, want := range map[string]string{"pkg.example.test": upstreamAddr1, "a.cdn.example.test": upstreamAddr2} {
		rcode, addrs := resolve(t, a, name)
		if rcode != dns.RcodeSuccess || !slices.Equal(addrs, []string{want}) {
			t.Fatalf("resolve %s: rcode %d %v, want %s", name, rcode, addrs, want)
		}
		if _, err := get(t, a, want, "/", 3*time.Second); err != nil {
			t.Fatalf("GET %s (%s): %v", name, want, err)
		}
	}
	// IPv6 answers are stripped; TCP works like UDP.
	if resp := query(t, a, "pkg.example.test", dns.TypeAAAA, "udp"); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Fatalf("AAAA pkg.example.test: %v", resp)
	}
	if resp := query(t, a, "pkg.example.test", dns.TypeA, "tcp"); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("A pkg.example.test over TCP: %v", resp)
	}
	// A source that is no sandbox's is refused.
	must(t, InNetNS(tp.hostNS, func() error {
		m := new(dns.Msg)
		m.SetQuestion("pkg.example.test.", dns.TypeA)
		resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, net.JoinHostPort(a.Gateway.String(), "53"))
		if err != nil {
			return err
		}
		if resp.Rcode != dns.RcodeRefused {
			return fmt.Errorf("query from the host: rcode %d, want REFUSED", resp.Rcode)
		}
		return nil
	}))
	if rcode, _ := resolve(t, a, "other.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("resolve other.example.test: rcode %d, want NXDOMAIN", rcode)
	}
	dialFails(t, a, upstreamOther+":80", true)

	// A runtime change: the new name works without recreating the sandbox.
	st, err := m.SetPolicy(context.Background(), "sb-allow", Policy{Mode: ModeAllowlist, Allow: []string{"@testidx", "other.example.test"}}, nil)
	must(t, err)
	if !slices.Equal(st.Allow, []string{"@testidx", "other.example.test"}) {
		t.Fatalf("allow after change = %v", st.Allow)
	}
	rcode, addrs := resolve(t, a, "other.example.test")
	if rcode != dns.RcodeSuccess || !slices.Equal(addrs, []string{upstreamOther}) {
		t.Fatalf("after the change, resolve other.example.test: rcode %d %v", rcode, addrs)
	}
	if _, err := get(t, a, upstreamOther, "/", 3*time.Second); err != nil {
		t.Fatalf("after the change, GET other.example.test: %v", err)
	}
	st, err = m.Status("sb-allow")
	must(t, err)
	if st.Counters.Allowed < 3 || st.Counters.Denied < 1 ||
		!slices.Contains(st.Counters.DeniedDestinations, upstreamOther) ||
		!slices.Contains(st.Counters.DeniedDestinations, "other.example.test") {
		t.Fatalf("counters = %+v, want 3 allowed, the direct connection and the refused name denied", st.Counters)
	}

	// Back to none and to egress at runtime.
	_, err = m.SetPolicy(context.Background(), "sb-allow", Policy{Mode: ModeNone}, nil)
	must(t, err)
	dialFails(t, a, upstreamAddr1+":80", false)
	_, err = m.SetPolicy(context.Background(), "sb-allow", Policy{Mode: ModeEgress}, nil)
	must(t, err)
	if _, err := get(t, a, upstreamOther, "/", 3*time.Second); err != nil {
		t.Fatalf("after switching to egress: %v", err)
	}
}

func TestBandwidthLimit(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	a := attach(t, m, "sb-bw", Request{Policy: Policy{Mode: ModeEgress}, Limits: Limits{BandwidthBytes: 1 << 20}})
	const size = 5 << 20
	start := time.Now()
	body, err := get(t, a, upstreamAddr1, fmt.Sprintf("/bytes?n=%d", size), 3*time.Second)
	d := time.Since(start)
	must(t, err)
	if len(body) != size {
		t.Fatalf("got %d bytes, want %d", len(body), size)
	}
	t.Logf("5 MiB at 1 MiB/s took %v", d)
	if d < 4500*time.Millisecond || d > 6*time.Second {
		t.Fatalf("5 MiB at 1 MiB/s took %v, want 4.5-6 s", d)
	}
}

func TestCreateTeardownLeavesNothing(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	ctx := context.Background()
	modes := []Mode{ModeEgress, ModeAllowlist, ModeNone}
	for i := range 30 {
		id := fmt.Sprintf("sb-%02d", i)
		req := Request{Policy: Policy{Mode: modes[i%3]}, Limits: Limits{BandwidthBytes: 10 << 20, ConnPerSecond: 50}}
		if req.Policy.Mode == ModeAllowlist {
			req.Policy.Allow = []string{"pkg.example.test", "198.51.100.0/24"}
		}
		if _, err := m.Attach(ctx, id, req, nil); err != nil {
			t.Fatalf("attach %s: %v", id, err)
		}
		// Tear every other one down at once, the rest at the end, so
		// sandboxes come and go while others live.
		if i%2 == 1 {
			must(t, m.Detach(ctx, id))
		}
	}
	for i := 0; i < 30; i += 2 {
		must(t, m.Detach(ctx, fmt.Sprintf("sb-%02d", i)))
	}
	tp.assertHostClean(t, m.cfg)
}

// TestGCAfterCrash: a manager that stops without detaching (a daemon
// killed mid-way) leaves its sandboxes' pieces; a new manager's GC, told
// that none of them lives, removes them all.
func TestGCAfterCrash(t *testing.T) {
	tp := newTopology(t)
	ctx := context.Background()
	cfg := tp.config()
	m1, err := New(cfg, tp.hostNS, tp.store)
	must(t, err)
	for i := range 5 {
		if _, err := m1.Attach(ctx, fmt.Sprintf("sb-crash-%d", i), Request{Policy: Policy{Mode: ModeEgress}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	m1.Close() // no Detach

	// sb-crash-0's namespace as an older daemon made it: privileged low
	// ports.
	ns0, err := netns.GetFromPath(m1.NetNSPath("sb-crash-0"))
	must(t, err)
	defer ns0.Close()
	if old, err := writeSysctl(ns0, "net/ipv4/ip_unprivileged_port_start", "1024"); err != nil || old != "0" {
		t.Fatalf("ip_unprivileged_port_start of a new sandbox namespace = %q (%v), want 0", old, err)
	}

	m2 := tp.manager(t, nil)
	// The restarted daemon adopts the live sandbox: same address, and its
	// network works (the forwarder is back, the rules are in place).
	a, err := m2.Attach(ctx, "sb-crash-0", Request{Policy: Policy{Mode: ModeEgress}}, nil)
	must(t, err)
	if v, err := readSysctl(ns0, "net/ipv4/ip_unprivileged_port_start"); err != nil || v != "0" {
		t.Fatalf("ip_unprivileged_port_start of the adopted namespace = %q (%v), want 0 written again", v, err)
	}
	if a.IP != netip.MustParseAddr("10.88.0.2") {
		t.Fatalf("adopted sandbox got %s, want its old address 10.88.0.2", a.IP)
	}
	if rcode, addrs := resolve(t, a, "pkg.example.test"); rcode != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("adopted sandbox resolves: %d %v", rcode, addrs)
	}
	if _, err := get(t, a, upstreamAddr1, "/", 3*time.Second); err != nil {
		t.Fatalf("adopted sandbox: %v", err)
	}
	live := func(id string) bool { return id == "sb-crash-0" }
	rep, err := m2.GC(ctx, live)
	must(t, err)
	if len(rep.Leases) != 4 || len(rep.Veths) != 4 || len(rep.Rules) != 4 || len(rep.Namespaces) != 4 || rep.HostSide {
		t.Fatalf("gc with one live sandbox: %+v", rep)
	}
	rep, err = m2.GC(ctx, func(string) bool { return false })
	must(t, err)
	if len(rep.Leases) != 1 || !rep.HostSide {
		t.Fatalf("gc with none live: %+v", rep)
	}
	tp.assertHostClean(t, cfg)
}

func TestBadConfigAndLimits(t *testing.T) {
	tp := newTopology(t)
	// The topology routes 198.18.0.0/24 (the uplink) and 10.99.0.0/24.
	for _, subnet := range []string{"198.18.0.0/16", "10.99.0.0/25"} {
		cfg := tp.config()
		cfg.Subnet = netip.MustParsePrefix(subnet)
		_, err := New(cfg, tp.hostNS, tp.store)
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "network.subnet:") {
			t.Fatalf("subnet %s overlapping a host route: %v, want invalid_argument naming network.subnet", subnet, err)
		}
	}
	m := tp.manager(t, func(c *Config) { c.MaxBandwidthBytes = 10 << 20; c.MaxConnPerSecond = 100 })
	ctx := context.Background()
	for _, c := range []struct {
		req   Request
		code  errdefs.Code
		field string
	}{
		{Request{Policy: Policy{Mode: ModeEgress}, Limits: Limits{BandwidthBytes: 20 << 20}}, errdefs.LimitExceeded, "network_bandwidth"},
		{Request{Policy: Policy{Mode: ModeEgress}, Limits: Limits{BandwidthBytes: 100}}, errdefs.InvalidArgument, "network_bandwidth"},
		{Request{Policy: Policy{Mode: ModeEgress}, Limits: Limits{ConnPerSecond: 1000}}, errdefs.LimitExceeded, "network_conn_rate"},
		{Request{Policy: Policy{Mode: ModeNone, Allow: []string{"pkg.example.test"}}}, errdefs.InvalidArgument, "allow"},
		{Request{Policy: Policy{Mode: ModeAllowlist, Allow: []string{"10.0.0.0/40"}}}, errdefs.InvalidArgument, "allow[0]"},
		{Request{Policy: Policy{Mode: ModeEgress}, Hostname: "-bad-"}, errdefs.InvalidArgument, "hostname"},
	} {
		_, err := m.Attach(ctx, "sb-bad", c.req, nil)
		if !errdefs.Is(err, c.code) || !strings.HasPrefix(errdefs.MessageOf(err), c.field+":") {
			t.Errorf("%+v: %v, want %s naming %s", c.req, err, c.code, c.field)
		}
	}
	if _, err := m.Attach(ctx, "../x", Request{}, nil); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("id with a slash: %v", err)
	}
	if _, err := m.SetPolicy(ctx, "sb-missing", Policy{Mode: ModeEgress}, nil); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("SetPolicy on an unknown sandbox: %v", err)
	}
	// Nothing was created by the refused requests.
	tp.assertHostClean(t, m.cfg)
}

// TestConnRateLimit: beyond the new-connection rate, first packets are
// dropped and counted as denied.
func TestConnRateLimit(t *testing.T) {
	tp := newTopology(t)
	m := tp.manager(t, nil)
	a := attach(t, m, "sb-rate", Request{Policy: Policy{Mode: ModeEgress}, Limits: Limits{ConnPerSecond: 5}})
	var ok, failed int
	must(t, inSandbox(t, a, func() error {
		for range 20 {
			c, err := net.DialTimeout("tcp4", upstreamAddr1+":80", 300*time.Millisecond)
			if err != nil {
				failed++
				continue
			}
			ok++
			c.Close()
		}
		return nil
	}))
	st, err := m.Status("sb-rate")
	must(t, err)
	t.Logf("20 connections at 5/s: %d ok, %d failed, counters %+v", ok, failed, st.Counters)
	if ok < 5 || failed == 0 || st.Counters.Denied == 0 {
		t.Fatalf("20 connections at 5/s: %d ok, %d failed, counters %+v: want the excess dropped and counted", ok, failed, st.Counters)
	}
}

// TestIPForwardRestoredToFound: whatever net.ipv4.ip_forward the host
// starts with (0 on a plain host, 1 on one that runs Docker or Kubernetes),
// it is 1 while a sandbox has network and is back to that value after the
// last one goes, by detach or by a restarted daemon's gc after a crash.
func TestIPForwardRestoredToFound(t *testing.T) {
	for _, found := range []string{"0", "1"} {
		t.Run("found="+found, func(t *testing.T) {
			tp := newTopology(t)
			if _, err := writeSysctl(tp.hostNS, "net/ipv4/ip_forward", found); err != nil {
				t.Fatal(err)
			}
			tp.forward = found
			ctx := context.Background()
			cfg := tp.config()
			forward := func() string {
				v, err := readSysctl(tp.hostNS, "net/ipv4/ip_forward")
				must(t, err)
				return v
			}

			m1, err := New(cfg, tp.hostNS, tp.store)
			must(t, err)
			if _, err := m1.Attach(ctx, "sb-fwd-0", Request{Policy: Policy{Mode: ModeEgress}}, nil); err != nil {
				t.Fatal(err)
			}
			if v := forward(); v != "1" {
				t.Errorf("ip_forward with a sandbox attached: %s, want 1", v)
			}
			must(t, m1.Detach(ctx, "sb-fwd-0"))
			if v := forward(); v != found {
				t.Errorf("ip_forward after the last detach: %s, want %s", v, found)
			}

			// Again, and the manager stops without detaching (a crash).
			if _, err := m1.Attach(ctx, "sb-fwd-1", Request{Policy: Policy{Mode: ModeEgress}}, nil); err != nil {
				t.Fatal(err)
			}
			m1.Close()
			m2 := tp.manager(t, nil)
			if v := forward(); v != "1" {
				t.Errorf("ip_forward after a restart with a sandbox left: %s, want 1", v)
			}
			if _, err := m2.GC(ctx, func(string) bool { return false }); err != nil {
				t.Fatal(err)
			}
			tp.assertHostClean(t, cfg)
		})
	}
}
