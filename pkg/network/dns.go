package network

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// dnsPolicy is what the forwarder asks the manager about a query's source.
type dnsPolicy interface {
	// policyFor returns the sandbox whose address src is, and its rules.
	policyFor(src netip.Addr) (key string, r *rules, ok bool)
	// allowResolved admits addresses an allowed name resolved to; it
	// must return only once they are in the sandbox's set, so that the
	// sandbox's connection, which follows the answer, passes.
	allowResolved(key string, addrs map[netip.Addr]time.Duration) error
	// refusedName records a name the sandbox at src was not allowed to
	// resolve.
	refusedName(src netip.Addr, name string)
	// hold decides a refused lookup: refuse at once, or after a call
	// watching the sandbox was asked; allow (the policy changed, look
	// again); drop (a copy of a held lookup too many).
	hold(src netip.Addr, name string) holdResult
}

// dnsForwarder is the resolver sandboxes with network use: it listens on
// the gateway address (UDP and TCP port 53) in the host namespace and
// answers from the upstream resolvers.
//
// Security boundary: in allowlist mode this is what makes names work. A
// query for a name the sandbox may not resolve is answered NXDOMAIN
// without asking upstream (so names cannot be used to smuggle data out
// either; a call watching the sandbox may hold the answer while its client
// is asked, approve.go, and sees only valid host names); the A records of allowed names go into the sandbox's nftables
// set before the answer is sent. AAAA records are removed from every answer
// (IPv6 is dropped), and a source address that is not a sandbox's is
// refused.
type dnsForwarder struct {
	policy    dnsPolicy
	upstreams []string // host:port
	// ns is where the forwarder's sockets, upstream ones included, are
	// made: always on a thread inside it, never "the process's namespace",
	// which no thread can be sure of (a thread locked into another
	// namespace may be the main one, whose namespace /proc/self shows).
	ns      netns.NsHandle
	servers []*dns.Server
	log     *slog.Logger
}

// startDNS listens on gw:53 inside ns and serves until stop.
func startDNS(ns netns.NsHandle, gw netip.Addr, upstreams []string, p dnsPolicy, log *slog.Logger) (*dnsForwarder, error) {
	f := &dnsForwarder{policy: p, upstreams: upstreams, ns: ns, log: log}
	addr := net.JoinHostPort(gw.String(), "53")
	var pc net.PacketConn
	var ln net.Listener
	err := InNetNS(ns, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp4", addr); err != nil {
			pc.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("DNS forwarder on %s: %w", addr, err)
	}
	var started sync.WaitGroup
	started.Add(2)
	for _, s := range []*dns.Server{
		{PacketConn: pc, Handler: dns.HandlerFunc(f.serve), NotifyStartedFunc: started.Done},
		{Listener: ln, Handler: dns.HandlerFunc(f.serve), NotifyStartedFunc: started.Done,
			ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second},
	} {
		f.servers = append(f.servers, s)
		go func() {
			if err := s.ActivateAndServe(); err != nil {
				f.log.Error("DNS forwarder stopped", "err", err)
			}
		}()
	}
	started.Wait()
	return f, nil
}

func (f *dnsForwarder) stop() {
	for _, s := range f.servers {
		_ = s.Shutdown()
	}
}

func (f *dnsForwarder) serve(w dns.ResponseWriter, req *dns.Msg) {
	reply := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		_ = w.WriteMsg(m)
	}
	src, err := netip.ParseAddrPort(w.RemoteAddr().String())
	if err != nil {
		reply(dns.RcodeRefused)
		return
	}
	key, r, ok := f.policy.policyFor(src.Addr().Unmap())
	if !ok {
		reply(dns.RcodeRefused)
		return
	}
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		reply(dns.RcodeFormatError)
		return
	}
	q := req.Question[0]
	if !r.allows(q.Name) {
		// A call watching the sandbox may be asked first (approve.go):
		// the lookup is held, and answered as allowed after a yes.
		name := strings.TrimSuffix(dns.CanonicalName(q.Name), ".")
		switch f.policy.hold(src.Addr().Unmap(), name) {
		case holdDrop:
			return
		case holdAllow:
			key, r, ok = f.policy.policyFor(src.Addr().Unmap())
		}
		if !ok || !r.allows(q.Name) {
			f.policy.refusedName(src.Addr().Unmap(), name)
			reply(dns.RcodeNameError)
			return
		}
	}
	if q.Qtype == dns.TypeAAAA {
		// No IPv6 for sandboxes: an empty answer makes clients use IPv4
		// at once instead of trying addresses that are dropped.
		m := new(dns.Msg)
		m.SetReply(req)
		_ = w.WriteMsg(m)
		return
	}
	resp, err := f.exchange(req)
	if err != nil {
		f.log.Warn("DNS forwarder: upstream failed", "name", q.Name, "err", err)
		reply(dns.RcodeServerFailure)
		return
	}
	resp.Id = req.Id
	resp.Answer = dropAAAA(resp.Answer)
	resp.Extra = dropAAAA(resp.Extra)
	if r.mode == ModeAllowlist {
		if err := f.policy.allowResolved(key, answerAddrs(resp)); err != nil {
			f.log.Error("DNS forwarder: cannot admit resolved addresses", "name", q.Name, "err", err)
			reply(dns.RcodeServerFailure)
			return
		}
	}
	if _, tcp := w.RemoteAddr().(*net.TCPAddr); !tcp {
		// The upstream answer may have come over TCP; a UDP client
		// gets it cut to its buffer size, with TC set, and asks again
		// over TCP.
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(size, int(o.UDPSize()))
		}
		resp.Truncate(size)
	}
	_ = w.WriteMsg(resp)
}

// answerAddrs are the IPv4 addresses of resp's answer, each with the
// longest TTL it was given: what an allowlist sandbox may then reach.
func answerAddrs(resp *dns.Msg) map[netip.Addr]time.Duration {
	addrs := map[netip.Addr]time.Duration{}
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, ok := netip.AddrFromSlice(a.A.To4())
			if !ok {
				continue
			}
			ttl := time.Duration(a.Hdr.Ttl) * time.Second
			addrs[ip] = max(addrs[ip], ttl)
		}
	}
	return addrs
}

func dropAAAA(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if _, ok := rr.(*dns.AAAA); !ok {
			out = append(out, rr)
		}
	}
	return out
}

// exchange asks the upstream resolvers in turn, over UDP, and again over
// TCP when an answer comes back truncated, whatever transport the sandbox
// used.
func (f *dnsForwarder) exchange(req *dns.Msg) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	var errs []error
	for _, up := range f.upstreams {
		resp, err := f.exchangeOne(req, "udp", up)
		if err == nil && resp.Truncated {
			resp, err = f.exchangeOne(req, "tcp", up)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (f *dnsForwarder) exchangeOne(req *dns.Msg, proto, upstream string) (*dns.Msg, error) {
	const timeout = 3 * time.Second
	var raw net.Conn
	dial := func() error {
		var err error
		raw, err = net.DialTimeout(proto, upstream, timeout)
		return err
	}
	if err := InNetNS(f.ns, dial); err != nil {
		return nil, err
	}
	conn := &dns.Conn{Conn: raw}
	defer conn.Close()
	c := &dns.Client{Net: proto, Timeout: timeout}
	resp, _, err := c.ExchangeWithConn(req, conn)
	return resp, err
}

// upstreamAddr makes host:port of a resolver address given as an IP.
func upstreamAddr(ip string) string {
	if _, _, err := net.SplitHostPort(ip); err == nil {
		return ip
	}
	return net.JoinHostPort(ip, strconv.Itoa(53))
}
