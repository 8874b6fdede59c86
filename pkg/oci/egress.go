package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"code.dny.dev/ssrf"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Registry egress of a restricted pull (a non-admin key's): the daemon
// opens the connections, from the host's network namespace, so a
// reference naming a registry is a request to connect wherever that name
// leads. A tenant must not reach the host's loopback services, the
// cloud's metadata address or the site's private networks that way.
//
// Security boundary: the check is made on the address dialled, never on
// the name. Each connection resolves its host once, keeps the addresses
// the rule allows and dials those literal addresses: a name that answers
// a public address to a first lookup and 127.0.0.1 to a second (DNS
// rebinding) cannot slip through, because nothing looks it up a second
// time. Every connection of the pull goes through the same dialer, so a
// redirect (to blob storage, or anywhere else) is held to the same rule
// as the registry itself. The public/non-public split is IANA's
// special-purpose registries (code.dny.dev/ssrf): RFC 1918, loopback,
// link-local, carrier-grade NAT (100.64/10), ULA (fc00::/7), everything
// outside IPv6 global unicast, documentation, benchmarking and reserved
// ranges, multicast. An IPv4-mapped IPv6 address is judged as the IPv4
// address it carries.

// Resolver looks up a host's addresses; *net.Resolver is one. Tests give
// their own to point a name at a loopback registry.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Egress restricts where a pull may connect: only public addresses,
// except the registries Allowed names. A nil *Egress (an admin's pull)
// restricts nothing.
type Egress struct {
	// Allowed lists the registries a restricted pull may reach at a
	// non-public address: "host" (any port) or "host:port", as image
	// references name registries (images.registries and
	// images.private_registries). A redirect's target is a host like any
	// other: it is reached only when public or named here.
	Allowed []string
	// Resolver looks names up; nil is net.DefaultResolver.
	Resolver Resolver
}

// publicOnly is the rule of what a restricted pull reaches by itself: any
// network and port, IANA's special-purpose prefixes refused.
var publicOnly = ssrf.New(ssrf.WithAnyNetwork(), ssrf.WithAnyPort())

// egressDialer dials for one restricted pull and keeps the first refusal,
// which the pull reports in place of however go-containerregistry and
// net/http wrapped it.
type egressDialer struct {
	rule   *Egress
	dialer net.Dialer
	mu     sync.Mutex
	first  *egressRefusal
}

// egressRefusal is a connection the rule refused.
type egressRefusal struct {
	host, port string
	addr       netip.Addr
	why        string
}

func (r *egressRefusal) Error() string {
	return fmt.Sprintf("%s resolves to %s, a %s address", net.JoinHostPort(r.host, r.port), r.addr, r.why)
}

func newEgressDialer(rule *Egress) *egressDialer {
	return &egressDialer{rule: rule, dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
}

// allowedByName reports whether Allowed names host:port.
func (d *egressDialer) allowedByName(host, port string) bool {
	for _, a := range d.rule.Allowed {
		if a == host || a == net.JoinHostPort(host, port) {
			return true
		}
	}
	return false
}

// DialContext is the transport's dialer: resolve once, keep the allowed
// addresses, dial them in order.
func (d *egressDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dial %s: port: %w", address, err)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		var res Resolver = net.DefaultResolver
		if d.rule.Resolver != nil {
			res = d.rule.Resolver
		}
		if addrs, err = res.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
	}
	named := d.allowedByName(host, port)
	var refused *egressRefusal
	var errs []error
	for _, a := range addrs {
		a = a.Unmap()
		if !named {
			if err := publicOnly.SafeAddr(a); err != nil {
				if refused == nil {
					refused = &egressRefusal{host: host, port: port, addr: a, why: addressKind(a)}
				}
				continue
			}
		}
		// The literal address: the name is not looked up again.
		c, err := d.dialer.DialContext(ctx, network, netip.AddrPortFrom(a, uint16(p)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if refused == nil {
		return nil, fmt.Errorf("dial %s: no address", address)
	}
	d.mu.Lock()
	if d.first == nil {
		d.first = refused
	}
	d.mu.Unlock()
	return nil, refused
}

// refusal returns the first connection refused, as the pull's error:
// permission_denied naming field, the registry and the address.
func (d *egressDialer) refusal(field, registry string) error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	r := d.first
	d.mu.Unlock()
	if r == nil {
		return nil
	}
	const rule = "a non-admin key pulls only from public addresses unless images.registries or images.private_registries names the host"
	if hp := net.JoinHostPort(r.host, r.port); registry == r.host || registry == hp {
		return errdefs.New(errdefs.PermissionDenied, "%s: registry %s resolves to %s, a %s address: %s", field, registry, r.addr, r.why, rule)
	}
	// Another host: where the registry redirected (or sent its token
	// realm).
	return errdefs.New(errdefs.PermissionDenied, "%s: registry %s sent the pull to %s, which resolves to %s, a %s address: %s", field, registry, net.JoinHostPort(r.host, r.port), r.addr, r.why, rule)
}

// addressKind names the class of a non-public address for the refusal.
func addressKind(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "link-local"
	case cgnat.Contains(a):
		return "carrier-grade NAT"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	}
	return "special-purpose (non-public)"
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")
