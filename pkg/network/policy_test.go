package network

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestCompileRejectsBadInput(t *testing.T) {
	presets := map[string][]string{"idx": {"pkg.example.test"}}
	for _, c := range []struct {
		name  string
		p     Policy
		field string // the error must name it
	}{
		{"unknown mode", Policy{Mode: "open"}, "allow.mode"},
		{"allow on none", Policy{Mode: ModeNone, Allow: []string{"pkg.example.test"}}, "allow"},
		{"allow on egress", Policy{Mode: ModeEgress, Allow: []string{"pkg.example.test"}}, "allow"},
		{"invalid CIDR", Policy{Mode: ModeAllowlist, Allow: []string{"a.example", "10.0.0.0/33"}}, "allow[1]"},
		{"IPv6 CIDR", Policy{Mode: ModeAllowlist, Allow: []string{"2001:db8::/32"}}, "allow[0]"},
		{"invalid host name", Policy{Mode: ModeAllowlist, Allow: []string{"bad host!"}}, "allow[0]"},
		{"label too long", Policy{Mode: ModeAllowlist, Allow: []string{strings.Repeat("a", 64) + ".example"}}, "allow[0]"},
		{"bare wildcard", Policy{Mode: ModeAllowlist, Allow: []string{"*.org"}}, "allow[0]"},
		{"wildcard inside", Policy{Mode: ModeAllowlist, Allow: []string{"a.*.example.org"}}, "allow[0]"},
		{"unknown preset", Policy{Mode: ModeAllowlist, Allow: []string{"@nope"}}, "allow[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := compile("allow", c.p, presets)
			if !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("err = %v, want invalid_argument", err)
			}
			if !strings.HasPrefix(errdefs.MessageOf(err), c.field+":") {
				t.Fatalf("message %q does not name %s", errdefs.MessageOf(err), c.field)
			}
		})
	}
}

func TestCompileAndMatch(t *testing.T) {
	r, err := compile("allow", Policy{Mode: ModeAllowlist, Allow: []string{"@idx", "*.pythonhosted.example", "Exact.Example.", "198.51.100.0/24", "203.0.113.7"}},
		map[string][]string{"idx": {"pkg.example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pkg.example.test.":              true,
		"files.pythonhosted.example":     true,
		"a.b.pythonhosted.example.":      true,
		"pythonhosted.example":           false, // the apex is not a subdomain
		"evilpythonhosted.example":       false,
		"exact.example":                  true,
		"sub.exact.example":              false,
		"pkg.example.test.attacker.test": false,
	} {
		if got := r.allows(name); got != want {
			t.Errorf("allows(%q) = %v, want %v", name, got, want)
		}
	}
	if len(r.prefixes) != 2 || r.prefixes[1] != netip.MustParsePrefix("203.0.113.7/32") {
		t.Errorf("prefixes = %v", r.prefixes)
	}
}

func TestIntervalElementsMerge(t *testing.T) {
	var ps []netip.Prefix
	for _, s := range []string{"10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8", "192.168.0.0/16", "fc00::/7", "255.255.255.0/24"} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	els := intervalElements(ps)
	// 10/8+11/8 merge into one range; 192.168/16; the last range reaches
	// the end of the address space and has no end element.
	var got []string
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key)
		s := a.String()
		if e.IntervalEnd {
			s = "end " + s
		}
		got = append(got, s)
	}
	want := []string{"10.0.0.0", "end 12.0.0.0", "192.168.0.0", "end 192.169.0.0", "255.255.255.0"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("elements = %v, want %v", got, want)
	}
}

func TestPackageIndexEnv(t *testing.T) {
	env := PackageIndexes{PipIndexURL: "http://198.18.0.2/simple/", NpmRegistry: "http://198.18.0.2/npm/", GoProxy: "http://198.18.0.2/go"}.Env()
	want := []string{"PIP_INDEX_URL=http://198.18.0.2/simple/", "PIP_TRUSTED_HOST=198.18.0.2", "NPM_CONFIG_REGISTRY=http://198.18.0.2/npm/", "GOPROXY=http://198.18.0.2/go"}
	if strings.Join(env, " ") != strings.Join(want, " ") {
		t.Fatalf("env = %v, want %v", env, want)
	}
	if env := (PackageIndexes{}).Env(); len(env) != 0 {
		t.Fatalf("empty indexes give %v", env)
	}
}

func TestFromConfig(t *testing.T) {
	n := config.Default().Network
	n.Presets = map[string][]string{"idx": {"pkg.example.test", "*.cdn.example.test", "198.51.100.0/24"}}
	n.MaxBandwidth, n.Bandwidth = 10<<20, 1<<20
	c, err := FromConfig(n, "/run/x", "http://mirror.test/debian")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Presets[DebianPreset]; len(got) != 1 || got[0] != "mirror.test" {
		t.Fatalf("debian preset from the mirror = %v", got)
	}
	if c.Subnet != netip.MustParsePrefix(n.Subnet) || len(c.Deny) != len(n.Deny) || c.MaxBandwidthBytes != 10<<20 {
		t.Fatalf("config = %+v", c)
	}
	if l := DefaultLimits(n); l.BandwidthBytes != 1<<20 {
		t.Fatalf("default limits = %+v", l)
	}
	n.Presets["bad"] = []string{"ok.example", "not a host"}
	_, err = FromConfig(n, "/run/x", "")
	if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "network.presets.bad[1]:") {
		t.Fatalf("bad preset entry: %v", err)
	}
}
