package testenv

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// The addresses of a Topology's uplink: the simulated host's end and the
// upstream's end (a TEST-NET block, routed nowhere on a real network).
const (
	HostUplinkAddr = "198.18.0.1"
	UpstreamAddr   = "198.18.0.2"
)

// Topology is a simulated host network namespace, where a test's engine or
// daemon keeps its network host side (bridge, NAT table, ip_forward), joined
// by a veth pair to an "upstream" namespace that holds the test's servers
// (UpstreamAddr) and that the host's default route points to. The machine's
// own namespace is never changed: sandboxes' traffic leaves through the
// simulated host to upstream and reaches only what the test serves there.
// Built with ip(8) (tests only); the namespaces and servers go at cleanup,
// also when the test fails.
type Topology struct {
	Host, Upstream string         // namespace names under /run/netns
	HostNS         netns.NsHandle // open until cleanup
	UpstreamNS     netns.NsHandle // open until cleanup
	// Forward is net.ipv4.ip_forward of Host as the topology was built
	// (HostForward): what a daemon must leave behind.
	Forward string
}

// ForwardEnv names the value ("0" or "1") of net.ipv4.ip_forward that a
// test's simulated host namespace starts with. Unset, it keeps what a new
// namespace inherits from the machine's (1 on hosts that run Docker or
// Kubernetes, under the default net.core.devconf_inherit_init_net). Set it
// to run the network tests as on such a host, or not, whatever the machine.
const ForwardEnv = "SANDBOXD_TEST_IP_FORWARD"

// HostForward applies ForwardEnv to the simulated host namespace ns (never
// the machine's) and returns the value of net.ipv4.ip_forward it starts
// with: tests compare with that, not with a constant.
func HostForward(t testing.TB, ns netns.NsHandle) string {
	t.Helper()
	const path = "/proc/sys/net/ipv4/ip_forward"
	var v []byte
	var err error
	InNamespace(t, ns, func() {
		if want := os.Getenv(ForwardEnv); want != "" {
			if want != "0" && want != "1" {
				err = fmt.Errorf("%s=%q: want 0 or 1", ForwardEnv, want)
				return
			}
			if err = os.WriteFile(path, []byte(want), 0); err != nil {
				return
			}
		}
		v, err = os.ReadFile(path)
	})
	if err != nil {
		t.Fatalf("ip_forward of the simulated host: %v", err)
	}
	t.Logf("the simulated host starts with net.ipv4.ip_forward %s", strings.TrimSpace(string(v)))
	return strings.TrimSpace(string(v))
}

// NewTopology builds the two namespaces; prefix (a few letters) starts
// their names, which end in a random suffix so tests run side by side.
func NewTopology(t testing.TB, prefix string) *Topology {
	t.Helper()
	sfx := RandHex(3)
	tp := &Topology{Host: prefix + "h-" + sfx, Upstream: prefix + "u-" + sfx}
	for _, n := range []string{tp.Host, tp.Upstream} {
		tp.IP(t, "netns", "add", n)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
		tp.IP(t, "-n", n, "link", "set", "lo", "up")
	}
	tp.IP(t, "-n", tp.Host, "link", "add", "uplink0", "type", "veth", "peer", "name", "down0", "netns", tp.Upstream)
	tp.IP(t, "-n", tp.Host, "addr", "add", HostUplinkAddr+"/24", "dev", "uplink0")
	tp.IP(t, "-n", tp.Host, "link", "set", "uplink0", "up")
	tp.IP(t, "-n", tp.Host, "route", "add", "default", "via", UpstreamAddr)
	tp.IP(t, "-n", tp.Upstream, "addr", "add", UpstreamAddr+"/24", "dev", "down0")
	tp.IP(t, "-n", tp.Upstream, "link", "set", "down0", "up")
	var err error
	if tp.HostNS, err = netns.GetFromName(tp.Host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.HostNS.Close() })
	if tp.UpstreamNS, err = netns.GetFromName(tp.Upstream); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.UpstreamNS.Close() })
	tp.Forward = HostForward(t, tp.HostNS)
	return tp
}

// IP runs ip(8) with args and fails the test if it fails. Tests name one of
// the topology's namespaces (-n) in it, never the machine's own.
func (tp *Topology) IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Listen opens a stream listener (network "tcp4", address ":80" or
// UpstreamAddr+":8088") in the upstream namespace.
func (tp *Topology) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	InNamespace(t, tp.UpstreamNS, func() { ln, err = net.Listen(network, addr) })
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// ServeHTTP serves h upstream on addr (e.g. ":80") until cleanup.
func (tp *Topology) ServeHTTP(t testing.TB, addr string, h http.Handler) {
	t.Helper()
	ln := tp.Listen(t, "tcp4", addr)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// ServeDNS answers A queries for the names of zone (fully qualified, lower
// case → IPv4 address) on UpstreamAddr:53 until cleanup; other names are
// NXDOMAIN.
func (tp *Topology) ServeDNS(t testing.TB, zone map[string]string) {
	t.Helper()
	var pc net.PacketConn
	var err error
	InNamespace(t, tp.UpstreamNS, func() { pc, err = net.ListenPacket("udp4", UpstreamAddr+":53") })
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ds := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if ip, ok := zone[strings.ToLower(q.Name)]; !ok {
			m.Rcode = dns.RcodeNameError
		} else if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(ip)})
		}
		_ = w.WriteMsg(m)
	})}
	go ds.ActivateAndServe()
	<-started
	t.Cleanup(func() { ds.Shutdown() })
}

// InNamespace runs fn on this goroutine's thread while it is inside ns (so
// sockets fn opens, and an engine's network host side made by fn, belong to
// ns), then moves the thread back.
func InNamespace(t testing.TB, ns netns.NsHandle, fn func()) {
	t.Helper()
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the test's namespace: %v", err)
	}
	goruntime.UnlockOSThread()
}
