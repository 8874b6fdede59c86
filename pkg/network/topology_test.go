package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The test topology, all in namespaces the test creates (the machine's own
// namespace is never touched):
//
//	sandbox netns ── veth ── [host netns: bridge, NAT, DNS forwarder] ── veth ── [upstream netns]
//	  10.88.x.y/16        gw 10.88.0.1     198.18.0.1/24              198.18.0.2/24
//
// The upstream namespace runs the test's HTTP server (on every address it
// has) and DNS server; it also holds a deny-listed address (10.99.0.1) and
// a public-looking one (203.0.113.10) that only a direct connection uses.
const (
	hostUplinkAddr = "198.18.0.1"
	upstreamAddr1  = "198.18.0.2"
	upstreamAddr2  = "198.18.0.3"   // *.cdn.example.test
	upstreamOther  = "203.0.113.10" // other.example.test
	upstreamDenied = "10.99.0.1"    // deny.example.test, in network.deny
	testSubnet     = "10.88.0.0/16"
	httpPort       = 80
)

var testZone = map[string]string{
	"pkg.example.test.":   upstreamAddr1,
	"a.cdn.example.test.": upstreamAddr2,
	"other.example.test.": upstreamOther,
	"deny.example.test.":  upstreamDenied,
}

type topology struct {
	dir          string
	hostNS, upNS netns.NsHandle
	hostPath     string
	store        *store.Store
	forward      string // ip_forward of hostNS as built (testenv.HostForward)
}

// newTopology builds the host and upstream namespaces and starts the
// upstream servers; everything goes at the end of the test.
func newTopology(t testing.TB) *topology {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	tp := &topology{dir: dir, hostPath: filepath.Join(dir, "host.ns")}
	upPath := filepath.Join(dir, "upstream.ns")
	for _, p := range []string{tp.hostPath, upPath} {
		if err := CreateNetNS(p, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := RemoveNetNS(p); err != nil {
				t.Error(err)
			}
		})
	}
	var err error
	if tp.hostNS, err = netns.GetFromPath(tp.hostPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.hostNS.Close() })
	if tp.upNS, err = netns.GetFromPath(upPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.upNS.Close() })
	tp.forward = testenv.HostForward(t, tp.hostNS)

	hh, err := netlink.NewHandleAt(tp.hostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	uh, err := netlink.NewHandleAt(tp.upNS)
	if err != nil {
		t.Fatal(err)
	}
	defer uh.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "uplink0"
	must(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "down0", PeerNamespace: netlink.NsFd(tp.upNS)}))
	up, err := hh.LinkByName("uplink0")
	must(t, err)
	must(t, hh.AddrAdd(up, &netlink.Addr{IPNet: prefixToIPNet(netip.MustParsePrefix(hostUplinkAddr + "/24"))}))
	must(t, hh.LinkSetUp(up))
	for _, n := range []string{"lo"} {
		l, err := hh.LinkByName(n)
		must(t, err)
		must(t, hh.LinkSetUp(l))
	}
	must(t, hh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP(upstreamAddr1)}))
	// The deny-listed upstream network, routed like any other.
	must(t, hh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP(upstreamAddr1),
		Dst: prefixToIPNet(netip.MustParsePrefix("10.99.0.0/24"))}))

	down, err := uh.LinkByName("down0")
	must(t, err)
	for _, a := range []string{upstreamAddr1 + "/24", upstreamAddr2 + "/24"} {
		must(t, uh.AddrAdd(down, &netlink.Addr{IPNet: prefixToIPNet(netip.MustParsePrefix(a))}))
	}
	must(t, uh.LinkSetUp(down))
	lo, err := uh.LinkByName("lo")
	must(t, err)
	must(t, uh.LinkSetUp(lo))
	for _, a := range []string{upstreamOther + "/32", upstreamDenied + "/32"} {
		must(t, uh.AddrAdd(lo, &netlink.Addr{IPNet: prefixToIPNet(netip.MustParsePrefix(a))}))
	}
	// Replies to the host's uplink address only: masquerade means the
	// upstream never needs a route to the sandboxes' subnet.

	tp.serveHTTP(t)
	tp.serveDNS(t)

	tp.store, err = store.Open(context.Background(), filepath.Join(dir, "state.db"))
	must(t, err)
	t.Cleanup(func() { tp.store.Close() })
	return tp
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// serveHTTP answers on every upstream address: "/" with the client's
// address as the server saw it, "/bytes?n=N" with N bytes.
func (tp *topology) serveHTTP(t testing.TB) {
	var ln net.Listener
	must(t, InNetNS(tp.upNS, func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(httpPort))
		return err
	}))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "client=%s", host)
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, len(buf))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// serveDNS answers testZone with A records, TTL 300, NXDOMAIN otherwise.
func (tp *topology) serveDNS(t testing.TB) {
	var pc net.PacketConn
	must(t, InNetNS(tp.upNS, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", upstreamAddr1+":53")
		return err
	}))
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		ip, ok := testZone[strings.ToLower(q.Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(ip)})
		case q.Qtype == dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 300}, AAAA: net.ParseIP("2001:db8::1")})
		}
		_ = w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
}

// config is the manager configuration of the test topology.
func (tp *topology) config() Config {
	var deny []netip.Prefix
	for _, d := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8"} {
		deny = append(deny, netip.MustParsePrefix(d))
	}
	return Config{
		Bridge:  "sbx0",
		Subnet:  netip.MustParsePrefix(testSubnet),
		Deny:    deny,
		DNS:     []string{upstreamAddr1},
		Presets: map[string][]string{"testidx": {"pkg.example.test", "*.cdn.example.test"}},
		RunDir:  filepath.Join(tp.dir, "run"),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// manager makes a manager on the topology; at the end of the test it
// checks that the host side is gone.
func (tp *topology) manager(t testing.TB, mutate func(*Config)) *Manager {
	t.Helper()
	cfg := tp.config()
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := New(cfg, tp.hostNS, tp.store)
	must(t, err)
	t.Cleanup(func() {
		_, err := m.GC(context.Background(), func(string) bool { return false })
		m.Close()
		if err != nil {
			t.Errorf("gc: %v", err)
		}
	})
	return m
}

// inSandbox runs fn inside a sandbox's namespace.
func inSandbox(t testing.TB, a *Attachment, fn func() error) error {
	t.Helper()
	ns, err := netns.GetFromPath(a.NetNSPath)
	must(t, err)
	defer ns.Close()
	return InNetNS(ns, fn)
}

// resolve asks the gateway's forwarder for name's A records from inside
// the sandbox.
func resolve(t testing.TB, a *Attachment, name string) (rcode int, addrs []string) {
	t.Helper()
	resp := query(t, a, name, dns.TypeA, "udp")
	for _, rr := range resp.Answer {
		if x, ok := rr.(*dns.A); ok {
			addrs = append(addrs, x.A.String())
		}
	}
	return resp.Rcode, addrs
}

// query sends one DNS question to the gateway from inside the sandbox.
func query(t testing.TB, a *Attachment, name string, qtype uint16, proto string) *dns.Msg {
	t.Helper()
	var resp *dns.Msg
	err := inSandbox(t, a, func() error {
		c := &dns.Client{Net: proto, Timeout: 3 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		var err error
		resp, _, err = c.Exchange(m, net.JoinHostPort(a.Gateway.String(), "53"))
		return err
	})
	must(t, err)
	return resp
}

// get fetches http://addr/path from inside the sandbox, with the dial
// bounded by timeout. It returns the body.
func get(t testing.TB, a *Attachment, addr, path string, timeout time.Duration) (string, error) {
	t.Helper()
	var body string
	err := inSandbox(t, a, func() error {
		conn, err := net.DialTimeout("tcp4", net.JoinHostPort(addr, strconv.Itoa(httpPort)), timeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if err := req.Write(conn); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	return body, err
}

// dialFails asserts a TCP connection from the sandbox to addr fails; with
// wantTimeout the packets must have been dropped (a refusal would mean
// they reached something).
func dialFails(t testing.TB, a *Attachment, addr string, wantTimeout bool) {
	t.Helper()
	err := inSandbox(t, a, func() error {
		c, err := net.DialTimeout("tcp4", addr, 700*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatalf("connection to %s succeeded, want it blocked", addr)
	}
	var ne net.Error
	if wantTimeout && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection to %s: %v, want a timeout (dropped)", addr, err)
	}
}

// listen starts a TCP listener inside ns on addr that accepts and closes.
func listen(t testing.TB, ns netns.NsHandle, addr string) {
	t.Helper()
	var ln net.Listener
	must(t, InNetNS(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
}

// assertHostClean checks that nothing of the manager's is left in the
// host namespace, the store and the run directory.
func (tp *topology) assertHostClean(t testing.TB, cfg Config) {
	t.Helper()
	h, err := netlink.NewHandleAt(tp.hostNS)
	must(t, err)
	defer h.Close()
	links, err := h.LinkList()
	must(t, err)
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, VethPrefix) || l.Attrs().Name == cfg.Bridge {
			t.Errorf("link %s left behind", l.Attrs().Name)
		}
	}
	leases, err := tp.store.ListLeases(context.Background())
	must(t, err)
	if len(leases) != 0 {
		t.Errorf("leases left: %v", leases)
	}
	if ok, err := newFirewall(tp.hostNS, cfg.Bridge, hostclaim.Mark(cfg.RunDir)).exists(); err != nil || ok {
		t.Errorf("nftables table left (exists=%v, err=%v)", ok, err)
	}
	if v, err := readSysctl(tp.hostNS, "net/ipv4/ip_forward"); err != nil || v != tp.forward {
		t.Errorf("ip_forward = %q (%v), want %s restored (the value the namespace started with)", v, err, tp.forward)
	}
	entries, _ := os.ReadDir(filepath.Join(cfg.RunDir, "netns"))
	if len(entries) != 0 {
		t.Errorf("namespace files left: %d", len(entries))
	}
}

// netDialer dials TCP with a timeout on the calling thread.
type netDialer struct{ timeout time.Duration }

func (d *netDialer) dial(addr string) (net.Conn, error) {
	return net.DialTimeout("tcp4", addr, d.timeout)
}
