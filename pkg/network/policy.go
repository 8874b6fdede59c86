package network

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Mode is a sandbox's network mode.
type Mode string

// The modes (SPEC.md).
const (
	// ModeNone is loopback only: the sandbox's namespace has no other link.
	ModeNone Mode = "none"
	// ModeEgress is every public destination, minus network.deny.
	ModeEgress Mode = "egress"
	// ModeAllowlist is only the allowed names (resolved through the
	// gateway's DNS forwarder) and CIDRs, minus network.deny.
	ModeAllowlist Mode = "allowlist"
)

// ParseMode checks a mode given by a client; field names it in the error.
func ParseMode(field, s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNone, ModeEgress, ModeAllowlist:
		return m, nil
	}
	return "", errdefs.Invalidf("%s: unknown network mode %q (none, egress or allowlist)", field, s)
}

// Policy is what a sandbox may reach. The zero value is ModeNone.
type Policy struct {
	Mode Mode
	// Allow is the allowlist as the client gave it: host names, wildcard
	// domains (*.example.org), CIDRs and @preset references. Only
	// meaningful in ModeAllowlist.
	Allow []string
}

// rules is a Policy with presets expanded and entries parsed.
type rules struct {
	mode      Mode
	hosts     map[string]bool // exact names, lower case, no trailing dot
	suffixes  []string        // from *.domain: ".domain"
	prefixes  []netip.Prefix  // IPv4 CIDRs
	allowText []string        // the client's list, for reporting back
}

// hostLabel is one DNS label (RFC 1123: letters, digits, hyphens, not at
// the ends); underscores are accepted for service names such as _http.
var hostLabel = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if !hostLabel.MatchString(l) {
			return false
		}
	}
	return true
}

// compile validates p and expands presets; field names the list in errors
// ("allow"), and each entry is named by its index.
func compile(field string, p Policy, presets map[string][]string) (*rules, error) {
	if p.Mode == "" {
		p.Mode = ModeNone
	}
	if _, err := ParseMode(field+".mode", string(p.Mode)); err != nil {
		return nil, err
	}
	r := &rules{mode: p.Mode, hosts: map[string]bool{}, allowText: slices.Clone(p.Allow)}
	if len(p.Allow) > 0 && p.Mode != ModeAllowlist {
		return nil, errdefs.Invalidf("%s: an allow list needs network mode allowlist, not %s", field, p.Mode)
	}
	var add func(name, entry string, depth int) error
	add = func(name, entry string, depth int) error {
		e := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(entry), "."))
		switch {
		case strings.HasPrefix(e, "@"):
			list, ok := presets[e[1:]]
			if !ok || depth > 0 {
				known := make([]string, 0, len(presets))
				for k := range presets {
					known = append(known, "@"+k)
				}
				slices.Sort(known)
				return errdefs.Invalidf("%s: unknown preset %q (network.presets defines %s)", name, entry, strings.Join(known, ", "))
			}
			for i, x := range list {
				if err := add(fmt.Sprintf("%s (network.presets.%s[%d])", name, e[1:], i), x, depth+1); err != nil {
					return err
				}
			}
		case strings.Contains(e, "/"):
			pfx, err := netip.ParsePrefix(e)
			if err != nil || !pfx.Addr().Is4() {
				return errdefs.Invalidf("%s: invalid IPv4 CIDR %q", name, entry)
			}
			r.prefixes = append(r.prefixes, pfx.Masked())
		case strings.HasPrefix(e, "*."):
			if !validHostname(e[2:]) || !strings.Contains(e[2:], ".") {
				return errdefs.Invalidf("%s: invalid wildcard domain %q (want *.domain.tld)", name, entry)
			}
			r.suffixes = append(r.suffixes, e[1:])
		default:
			if a, err := netip.ParseAddr(e); err == nil {
				if !a.Is4() {
					return errdefs.Invalidf("%s: %q: IPv6 is not routed to sandboxes", name, entry)
				}
				r.prefixes = append(r.prefixes, netip.PrefixFrom(a, 32))
				return nil
			}
			if !validHostname(e) {
				return errdefs.Invalidf("%s: invalid host name %q", name, entry)
			}
			r.hosts[e] = true
		}
		return nil
	}
	for i, e := range p.Allow {
		if err := add(fmt.Sprintf("%s[%d]", field, i), e, 0); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// allows reports whether a DNS name (any case, trailing dot or not) may be
// resolved under r.
func (r *rules) allows(name string) bool {
	switch r.mode {
	case ModeEgress:
		return true
	case ModeAllowlist:
		n := strings.ToLower(strings.TrimSuffix(name, "."))
		if r.hosts[n] {
			return true
		}
		for _, s := range r.suffixes {
			// *.example.org matches a.example.org and a.b.example.org,
			// not example.org itself (as in TLS certificates' sense of
			// "any subdomain"; list the apex separately).
			if strings.HasSuffix(n, s) {
				return true
			}
		}
	}
	return false
}

// Limits are a sandbox's network limits; zero means no limit.
type Limits struct {
	// BandwidthBytes is the rate, in bytes per second, of traffic in each
	// direction between the sandbox and the bridge.
	BandwidthBytes uint64
	// ConnPerSecond bounds new connections (and other first packets of a
	// flow) the sandbox opens per second; beyond it they are dropped and
	// counted as denied.
	ConnPerSecond uint32
}
