package network

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// ResolvConf is a sandbox's /etc/resolv.conf: the gateway's forwarder, or,
// without network, no resolver at all (lookups fail at once instead of
// timing out).
func ResolvConf(gateway netip.Addr) []byte {
	if !gateway.IsValid() {
		return []byte("# no network: no resolver\n")
	}
	// The forwarder is one hop away and always answers (NXDOMAIN for a
	// name outside the allowlist at once, SERVFAIL when upstream fails),
	// except while it holds a refused name's lookup for a network
	// approval (network.approval_hold, at most 40 s). glibc waits
	// timeout x attempts for one nameserver (its defaults, 5 s x 2, give
	// up after 10 s), so 10 s x 5 lets a lookup outlive the longest hold,
	// its retries deduplicated by the forwarder; the cost is 10 s instead
	// of 2 s for a datagram lost on the bridge. musl waits timeout alone
	// (10 s): an Alpine sandbox outlives only a hold that short.
	return fmt.Appendf(nil, "nameserver %s\noptions timeout:10 attempts:5\n", gateway)
}

// Hosts is a sandbox's /etc/hosts.
func Hosts(hostname string, ip netip.Addr) []byte {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ip.IsValid() {
		fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
	} else {
		fmt.Fprintf(&b, "127.0.1.1\t%s\n", hostname)
	}
	return []byte(b.String())
}

// PackageIndexes are the package indexes and mirrors sandboxes install
// from (network.package_indexes); empty fields leave the managers' own
// defaults.
type PackageIndexes struct {
	PipIndexURL string `yaml:"pip_index_url" json:"pip_index_url,omitempty"`
	NpmRegistry string `yaml:"npm_registry" json:"npm_registry,omitempty"`
	GoProxy     string `yaml:"go_proxy" json:"go_proxy,omitempty"`
}

// Env returns the package managers' usual environment variables for p.
// A pip index over plain http is also named in PIP_TRUSTED_HOST, as pip
// otherwise refuses it.
func (p PackageIndexes) Env() []string {
	var env []string
	if p.PipIndexURL != "" {
		env = append(env, "PIP_INDEX_URL="+p.PipIndexURL)
		if u, err := url.Parse(p.PipIndexURL); err == nil && u.Scheme == "http" {
			env = append(env, "PIP_TRUSTED_HOST="+u.Hostname())
		}
	}
	if p.NpmRegistry != "" {
		env = append(env, "NPM_CONFIG_REGISTRY="+p.NpmRegistry)
	}
	if p.GoProxy != "" {
		env = append(env, "GOPROXY="+p.GoProxy)
	}
	return env
}
