package network

import (
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// DebianPreset is the preset FromConfig defines when the configuration
// does not: the host of the Debian mirror images are built from
// (images.mirror, else the host's apt sources), so that a sandbox can
// `apt-get` from the same mirror with allow ["@debian"].
const DebianPreset = "debian"

// FromConfig turns the validated `network` section into a manager
// configuration; runDir is paths.run_dir, mirror the Debian mirror URL
// images are built from ("" if unknown).
func FromConfig(n config.Network, runDir, mirror string) (Config, error) {
	subnet, err := netip.ParsePrefix(n.Subnet)
	if err != nil {
		return Config{}, errdefs.Invalidf("network.subnet: %v", err)
	}
	c := Config{
		Bridge:  n.Bridge,
		Subnet:  subnet,
		MTU:     n.MTU,
		DNS:     slices.Clone(n.DNS),
		Presets: maps.Clone(n.Presets),
		PackageIndexes: PackageIndexes{
			PipIndexURL: n.PackageIndexes.PipIndexURL,
			NpmRegistry: n.PackageIndexes.NpmRegistry,
			GoProxy:     n.PackageIndexes.GoProxy,
		},
		RunDir:            runDir,
		MaxBandwidthBytes: uint64(max(n.MaxBandwidth, 0)),
		MaxConnPerSecond:  uint32(max(n.MaxConnRate, 0)),
		ApprovalHold:      n.ApprovalHold.D(),
	}
	for i, d := range n.Deny {
		p, err := netip.ParsePrefix(d)
		if err != nil {
			return Config{}, errdefs.Invalidf("network.deny[%d]: %v", i, err)
		}
		c.Deny = append(c.Deny, p)
	}
	if _, ok := c.Presets[DebianPreset]; !ok && mirror != "" {
		if u, err := url.Parse(mirror); err == nil && u.Hostname() != "" {
			if c.Presets == nil {
				c.Presets = map[string][]string{}
			}
			c.Presets[DebianPreset] = []string{u.Hostname()}
		}
	}
	if err := checkPresets(c.Presets); err != nil {
		return Config{}, err
	}
	c.CredentialPort = n.CredentialPort
	for name, cc := range n.Credentials {
		u, err := url.Parse(cc.BaseURL)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return Config{}, errdefs.Invalidf("network.credentials.%s.base_url: want an http(s) URL, got %q", name, cc.BaseURL)
		}
		if c.Credentials == nil {
			c.Credentials = map[string]Credential{}
		}
		c.Credentials[name] = Credential{BaseURL: u, Header: cc.Header, HeaderPrefix: cc.HeaderPrefix,
			SecretEnv: cc.SecretEnv, SecretFile: cc.SecretFile, BaseURLEnv: cc.BaseURLEnv, KeyEnv: cc.KeyEnv,
			MaxRequests: cc.MaxRequests, MaxTokens: cc.MaxTokens}
	}
	return c, nil
}

// DefaultLimits are the limits of a sandbox that asks for none.
func DefaultLimits(n config.Network) Limits {
	return Limits{BandwidthBytes: uint64(max(n.Bandwidth, 0)), ConnPerSecond: uint32(max(n.ConnRate, 0))}
}

// checkPresets compiles every preset once, so a bad entry is reported at
// start-up, naming it, rather than when a sandbox first uses it.
func checkPresets(presets map[string][]string) error {
	for _, name := range slices.Sorted(maps.Keys(presets)) {
		if _, err := compile(fmt.Sprintf("network.presets.%s", name), Policy{Mode: ModeAllowlist, Allow: presets[name]}, nil); err != nil {
			return err
		}
	}
	return nil
}
