package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Where a webhook may be delivered. Security boundary: a URL is a request
// the daemon makes from the host's network on a tenant's behalf, so a
// tenant must not point it at the host itself, its LAN or a cloud
// metadata address. Those addresses — private, loopback, link-local,
// shared (CGNAT) — need the administrator's allow: webhooks.allow_private,
// or an admin key registering the hook. The check runs at registration on
// every address the name resolves to, and again on every dial, where the
// connection goes to the very address checked (pinned), so a name that
// resolves elsewhere by the time of delivery (DNS rebinding) gains
// nothing. Unspecified and multicast addresses are never dialled.

// resolveTimeout bounds a registration's name lookup.
const resolveTimeout = 5 * time.Second

// cgnat is the shared address space of RFC 6598, private in practice.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

type defaultResolver struct{}

func (defaultResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

// restricted says what kind of address a needs the administrator's allow
// for, or "".
func restricted(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate(), cgnat.Contains(a):
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	}
	return ""
}

// checkAddr says whether a webhook may be delivered to a: nil, or an
// error naming field.
func (s *Service) checkAddr(field string, a netip.Addr, admin bool) error {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsUnspecified():
		return errdefs.Invalidf("%s: the unspecified address cannot receive webhooks", field)
	case a.IsMulticast(), a.IsInterfaceLocalMulticast(), a.IsLinkLocalMulticast():
		return errdefs.Invalidf("%s: %s is a multicast address", field, a)
	case a.Is4() && a.As4()[0] == 0, a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errdefs.Invalidf("%s: %s cannot receive webhooks", field, a)
	}
	kind := restricted(a)
	if kind == "" || admin {
		return nil
	}
	for _, p := range s.allow {
		if p.Contains(a) {
			return nil
		}
	}
	return errdefs.PermissionDeniedf("%s: %s is a %s address; a webhook may reach it only when webhooks.allow_private lists it or an admin key registers the webhook", field, a, kind)
}

// checkURL validates a webhook URL for a caller (admin or not) and returns
// it as it will be used.
func (s *Service) checkURL(ctx context.Context, raw string, admin bool) (string, error) {
	u, host, err := parseURL(raw)
	if err != nil {
		return "", err
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return u, s.checkAddr("url", a, admin)
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := s.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return "", errdefs.Invalidf("url: host %q does not resolve", host)
	}
	for _, a := range addrs {
		if err := s.checkAddr("url", a, admin); err != nil {
			return "", err
		}
	}
	return u, nil
}

// parseURL checks the URL's form: http or https, a host, no credentials
// or fragment, at most maxURLBytes. It returns the URL and its host
// (brackets of an IPv6 literal removed).
func parseURL(raw string) (string, string, error) {
	switch {
	case raw == "":
		return "", "", errdefs.Invalidf("url: required")
	case len(raw) > maxURLBytes:
		return "", "", errdefs.Invalidf("url: longer than %d bytes", maxURLBytes)
	case strings.ContainsFunc(raw, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "", "", errdefs.Invalidf("url: holds a space or control character")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", "", errdefs.Invalidf("url: not a URL (%v)", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", "", errdefs.Invalidf("url: scheme %q is not http or https", u.Scheme)
	case u.Opaque != "":
		return "", "", errdefs.Invalidf("url: not an absolute http(s) URL with a host")
	case u.User != nil:
		return "", "", errdefs.Invalidf("url: credentials in the URL are refused (the signature authenticates the daemon)")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return "", "", errdefs.Invalidf("url: a fragment is never sent; remove it")
	case u.Hostname() == "":
		return "", "", errdefs.Invalidf("url: no host")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", "", errdefs.Invalidf("url: port %q is out of range", p)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", "", errdefs.Invalidf("url: empty port")
	}
	host := u.Hostname()
	if _, err := netip.ParseAddr(host); err != nil {
		if strings.HasPrefix(u.Host, "[") {
			return "", "", errdefs.Invalidf("url: %q is not an IPv6 address", host)
		}
		if !validHostname(host) {
			return "", "", errdefs.Invalidf("url: %q is not a host name", host)
		}
	} else if strings.Contains(host, "%") {
		return "", "", errdefs.Invalidf("url: an address with a zone is refused")
	}
	return u.String(), host, nil
}

// validHostname checks a DNS name's syntax (letters, digits, hyphens and
// underscores in dot-separated labels of at most 63 bytes).
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// dialer returns the DialContext of a hook's deliveries: the host is
// resolved here, each address checked, and the connection made to the
// checked address itself.
func (s *Service) dialer(allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, portText, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(portText, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", portText, err)
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else if addrs, err = s.resolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		var errs []error
		for _, a := range addrs {
			if err := s.checkAddr("url", a, allowPrivate); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s", host, errdefs.MessageOf(err)))
				continue
			}
			c, err := d.DialContext(ctx, network, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, fmt.Errorf("%s: no address", host)
		}
		return nil, errors.Join(errs...)
	}
}
