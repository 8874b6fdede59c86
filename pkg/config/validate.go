package config

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Smallest accepted limits. Below them a sandbox cannot even start its agent
// and a shell, and the failure would surface as an obscure OOM kill or
// EAGAIN from fork instead of a configuration error.
const (
	minMemory      ByteSize = 16 << 20
	minDisk        ByteSize = 16 << 20
	minPids        int64    = 16
	minOutputLimit ByteSize = 1 << 10
	minMCPResult   ByteSize = 4 << 10
	minExecTimeout          = Duration(time.Second)
)

var (
	// plainName is a file or recipe name: no path separators, no leading
	// dot, so it can never escape the directory it is looked up in.
	plainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	envName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate checks what the types cannot: paths are absolute, defaults lie
// within their caps, names, addresses and CIDRs parse, enumerations hold one
// of their values, and settings that depend on each other agree. It reads no
// files and opens no sockets, so a configuration can be checked on any
// machine. It returns nil or a *ValidationError listing every problem.
func (c *Config) Validate() error {
	var p problems
	c.Server.validate(&p)
	c.Paths.validate(&p)
	c.Sandbox.validate(&p, c.Images.Languages)
	c.Network.validate(&p)
	c.Images.validate(&p)
	c.Runs.validate(&p)
	c.Snapshots.validate(&p)
	c.Webhooks.validate(&p)
	c.Volumes.validate(&p)
	c.Autofix.validate(&p)
	c.VM.validate(&p)
	c.E2B.validate(&p)
	c.Audit.validate(&p)
	c.SSH.validate(&p)
	c.Store.validate(&p)
	c.Node.validate(&p)
	c.Gateway.validate(&p)
	c.Log.validate(&p)
	c.Telemetry.validate(&p)
	return p.err()
}

func (a *Audit) validate(p *problems) {
	if a.Dir != "" {
		p.absPath("audit.dir", a.Dir)
	}
	if a.MaxFileBytes < 4<<10 {
		p.add("audit.max_file_bytes", "", "must be at least 4K, got %s", a.MaxFileBytes)
	}
	if a.MaxFileAge < Duration(time.Minute) {
		p.add("audit.max_file_age", "", "must be at least 1m, got %s", a.MaxFileAge)
	}
	if a.MaxTotalBytes != 0 && a.MaxTotalBytes < a.MaxFileBytes {
		p.add("audit.max_total_bytes", "", "must be 0 (no limit) or at least audit.max_file_bytes, got %s", a.MaxTotalBytes)
	}
	if a.RetentionAge < 0 {
		p.add("audit.retention_age", "", "must be 0 (no limit) or positive, got %s", a.RetentionAge)
	}
	if a.CheckpointEvery < 1 || a.CheckpointEvery > 1<<20 {
		p.add("audit.checkpoint_every", "", "must be from 1 to 1048576, got %d", a.CheckpointEvery)
	}
	if a.VerifyInterval != 0 && a.VerifyInterval < Duration(time.Minute) {
		p.add("audit.verify_interval", "", "must be 0 (only on request) or at least 1m, got %s", a.VerifyInterval)
	}
}

func (s *Store) validate(p *problems) {
	if s.PostgresURL == "" {
		return
	}
	// Never echo the URL: it may hold a password.
	u, err := url.Parse(s.PostgresURL)
	switch {
	case err != nil:
		p.add("store.postgres_url", "", "not a URL")
	case u.Scheme != "postgres" && u.Scheme != "postgresql":
		p.add("store.postgres_url", "", "want a postgres:// or postgresql:// URL, got scheme %q", u.Scheme)
	case u.Host == "" && u.Query().Get("host") == "":
		p.add("store.postgres_url", "", "names no host (host:port, or ?host=/socket/dir)")
	}
}

// maxOTLPHeaders bounds telemetry.otlp_headers (a collector needs one or
// two: an API key, a tenant).
const maxOTLPHeaders = 16

func (t *Telemetry) validate(p *problems) {
	p.oneOf("telemetry.otlp_protocol", t.OTLPProtocol, "http/protobuf", "grpc")
	if t.OTLPEndpoint != "" {
		p.httpURL("telemetry.otlp_endpoint", t.OTLPEndpoint)
		if u, err := url.Parse(t.OTLPEndpoint); err == nil && (u.User != nil || u.RawQuery != "" || u.Fragment != "") {
			// Credentials belong in otlp_headers; a query or fragment is
			// not part of OTLP and would be sent or dropped silently.
			p.add("telemetry.otlp_endpoint", "", "must have no user info, query or fragment (put credentials in telemetry.otlp_headers)")
		}
	}
	if len(t.OTLPHeaders) > maxOTLPHeaders {
		p.add("telemetry.otlp_headers", "", "at most %d headers, got %d", maxOTLPHeaders, len(t.OTLPHeaders))
	}
	for k, v := range t.OTLPHeaders {
		if !httpToken(k) {
			p.add("telemetry.otlp_headers", "", "header name %q is not an HTTP token", k)
		}
		// The value is a secret: the message never quotes it.
		if len(v) > 4096 || strings.ContainsAny(v, "\r\n\x00") {
			p.add("telemetry.otlp_headers", "", "value of %q must be at most 4096 bytes without CR, LF or NUL", k)
		}
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 || t.SampleRatio != t.SampleRatio {
		p.add("telemetry.sample_ratio", "", "must be from 0 to 1, got %v", t.SampleRatio)
	}
	if t.ServiceName == "" || len(t.ServiceName) > 128 || strings.ContainsFunc(t.ServiceName, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		p.add("telemetry.service_name", "", "must be 1 to 128 printable characters, got %q", t.ServiceName)
	}
}

// httpToken says whether s is an HTTP header name (RFC 9110 token).
func httpToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func (s *SSH) validate(p *problems) {
	if s.Listen != "" {
		p.hostPort("ssh.listen", s.Listen)
	}
	if s.Keepalive < 0 {
		p.add("ssh.keepalive", s.Keepalive.String(), "must not be negative")
	}
	if s.TokenTTL <= 0 || s.TokenTTL.D() > MaxSSHTokenTTL {
		p.add("ssh.token_ttl", s.TokenTTL.String(), "must be more than 0 and at most %s", MaxSSHTokenTTL)
	}
}

// nodeName is a node's name: a DNS label, as Kubernetes node names are.
var nodeName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (n *Node) validate(p *problems) {
	if n.Name != "" && !nodeName.MatchString(n.Name) {
		p.add("node.name", "", "must be a DNS label ([a-z0-9-], at most 63), got %q", n.Name)
	}
	if n.GatewaySecretFile != "" {
		p.absPath("node.gateway_secret_file", n.GatewaySecretFile)
	}
}

func (g *Gateway) validate(p *problems) {
	if g.Listen != "" {
		p.hostPort("gateway.listen", g.Listen)
	}
	seen := map[string]bool{}
	for i, n := range g.Nodes {
		key := fmt.Sprintf("gateway.nodes[%d]", i)
		if !nodeName.MatchString(n.Name) {
			p.add(key+".name", "", "must be a DNS label ([a-z0-9-], at most 63), got %q", n.Name)
		}
		if seen[n.Name] {
			p.add(key+".name", "", "duplicate node %q", n.Name)
		}
		seen[n.Name] = true
		p.httpURL(key+".url", n.URL)
	}
	if k := g.Kubernetes; k.Service != "" || k.Namespace != "" || k.PortName != "" {
		for _, kv := range [][2]string{{"gateway.kubernetes.namespace", k.Namespace}, {"gateway.kubernetes.service", k.Service}, {"gateway.kubernetes.port_name", k.PortName}} {
			if !nodeName.MatchString(kv[1]) {
				p.add(kv[0], "", "must be a DNS label ([a-z0-9-], at most 63), got %q", kv[1])
			}
		}
		if len(g.Nodes) > 0 {
			p.add("gateway.nodes", "", "must be empty with gateway.kubernetes (one source of nodes)")
		}
	}
	for _, kv := range [][2]string{{"gateway.secret_file", g.SecretFile}, {"gateway.auth_token_file", g.AuthTokenFile}, {"gateway.state_db", g.StateDB}} {
		if kv[1] != "" {
			p.absPath(kv[0], kv[1])
		}
	}
	if g.NodeTimeout <= 0 {
		p.add("gateway.node_timeout", "", "must be more than 0, got %s", g.NodeTimeout)
	}
	if g.ProbeInterval <= 0 {
		p.add("gateway.probe_interval", "", "must be more than 0, got %s", g.ProbeInterval)
	}
	if g.ReconcileInterval <= 0 {
		p.add("gateway.reconcile_interval", "", "must be more than 0, got %s", g.ReconcileInterval)
	}
	if g.E2BListen != "" {
		p.hostPort("gateway.e2b_listen", g.E2BListen)
	}
	if g.PreviewListen != "" {
		p.hostPort("gateway.preview_listen", g.PreviewListen)
	}
	if g.PreviewURL != "" {
		if u, err := url.Parse(g.PreviewURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			p.add("gateway.preview_url", "", "want an http:// or https:// URL with a host and no query, got %q", g.PreviewURL)
		}
	}
	if d := g.E2BDomain; d != "" && (strings.ContainsAny(d, "/ :@") || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".")) {
		p.add("gateway.e2b_domain", "", "must be a DNS name like sandboxes.example.com, got %q", d)
	}
}

func (e *E2B) validate(p *problems) {
	if e.Listen == "" {
		return
	}
	p.hostPort("e2b.listen", e.Listen)
	if e.APIKeyFile == "" {
		p.add("e2b.api_key_file", "", "required when e2b.listen is set")
	} else {
		p.absPath("e2b.api_key_file", e.APIKeyFile)
	}
	if (e.TLSCert == "") != (e.TLSKey == "") {
		p.add("e2b.tls_cert", "", "e2b.tls_cert and e2b.tls_key go together")
	}
	if e.TLSCert != "" {
		p.absPath("e2b.tls_cert", e.TLSCert)
		p.absPath("e2b.tls_key", e.TLSKey)
	}
	if d := e.Domain; d != "" && (strings.ContainsAny(d, "/ :@") || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".")) {
		p.add("e2b.domain", "", "must be a DNS name like sandboxes.example.com, got %q", d)
	}
}

func (s *Server) validate(p *problems) {
	p.absPath("server.socket", s.Socket)
	if s.HTTPAddr != "" {
		p.hostPort("server.http_addr", s.HTTPAddr)
		// HTTP is never served without a token (docs/SPEC.md: the bearer token is
		// required on HTTP except /healthz).
		if s.AuthTokenFile == "" {
			p.add("server.auth_token_file", "", "required when server.http_addr is set")
		}
	}
	if s.AuthTokenFile != "" {
		p.absPath("server.auth_token_file", s.AuthTokenFile)
	}
	if s.PreviewListen != "" && s.PreviewListen != s.HTTPAddr {
		// Port 0 is allowed: the listener picks one and the URLs say which.
		if _, port, err := net.SplitHostPort(s.PreviewListen); err == nil && port == "0" {
			p.hostPort("server.preview_listen", strings.TrimSuffix(s.PreviewListen, "0")+"1")
		} else {
			p.hostPort("server.preview_listen", s.PreviewListen)
		}
	} else if s.PreviewListen != "" {
		p.add("server.preview_listen", "", "must differ from server.http_addr: previews need an origin of their own")
	}
	if s.MCPMaxResultBytes < minMCPResult {
		p.add("server.mcp_max_result_bytes", "", "%v is below the minimum of %v", s.MCPMaxResultBytes, minMCPResult)
	}
	p.oneOf("server.mcp_on_session_end", s.MCPOnSessionEnd, SessionEndKeep, SessionEndTerminate)
	if m, err := strconv.ParseUint(s.SocketMode, 8, 32); err != nil || m > 0o777 {
		p.add("server.socket_mode", "", "invalid value %q (want octal permission bits such as \"0660\")", s.SocketMode)
	} else if m&0o600 != 0o600 {
		p.add("server.socket_mode", "", "%q: the owner (root) needs read and write", s.SocketMode)
	}
	if s.MCPProgressInterval.D() < time.Second || s.MCPProgressInterval.D() > 10*time.Minute {
		p.add("server.mcp_progress_interval", "", "%v: want between 1s and 10m", s.MCPProgressInterval.D())
	}
	if s.MaxRequestBytes < 64<<10 || s.MaxRequestBytes > 1<<30 {
		p.add("server.max_request_bytes", "", "must be from 64K to 1G, got %d bytes", int64(s.MaxRequestBytes))
	}
	seen := make(map[string]bool)
	for i, t := range s.Tools {
		key := fmt.Sprintf("server.tools[%d]", i)
		switch {
		case !slices.Contains(ToolGroups, t):
			p.add(key, "", "unknown tool group %q%s (use %s)", t, didYouMean(t, ToolGroups), strings.Join(ToolGroups, ", "))
		case seen[t]:
			p.add(key, "", "tool group %q listed twice", t)
		}
		seen[t] = true
	}
}

func (ps *Paths) validate(p *problems) {
	p.absPath("paths.state_dir", ps.StateDir)
	p.absPath("paths.run_dir", ps.RunDir)
	p.absPath("paths.recipes_dir", ps.RecipesDir)
	p.absPath("paths.seccomp_dir", ps.SeccompDir)
	p.absPath("paths.agent_path", ps.AgentPath)
	if ps.ImagesDir != "" {
		p.absPath("paths.images_dir", ps.ImagesDir)
	}
	if ps.SandboxesDir != "" {
		p.absPath("paths.sandboxes_dir", ps.SandboxesDir)
	}
}

func (s *Sandbox) validate(p *problems, languages []string) {
	limit(p, "sandbox.memory", s.Memory, s.MaxMemory, minMemory)
	if !(s.CPUs > 0) { // also catches NaN
		p.add("sandbox.cpus", "", "must be greater than 0, got %v", s.CPUs)
	} else if s.CPUs > s.MaxCPUs {
		p.add("sandbox.cpus", "", "%v exceeds sandbox.max_cpus %v", s.CPUs, s.MaxCPUs)
	}
	limit(p, "sandbox.pids", s.Pids, s.MaxPids, minPids)
	limit(p, "sandbox.disk", s.Disk, s.MaxDisk, minDisk)
	if s.DiskBacking != "disk" && s.DiskBacking != "memory" {
		p.add("sandbox.disk_backing", "", "must be disk or memory, got %q", s.DiskBacking)
	}
	limit(p, "sandbox.exec_timeout", s.ExecTimeout, s.MaxExecTimeout, minExecTimeout)
	if s.IdleTimeout < 0 {
		p.add("sandbox.idle_timeout", "", "must not be negative (0 means never)")
	}
	if s.MaxLifetime < 0 {
		p.add("sandbox.max_lifetime", "", "must not be negative (0 means never)")
	}
	if s.MaxSandboxes < 1 {
		p.add("sandbox.max_sandboxes", "", "must be at least 1, got %d", s.MaxSandboxes)
	}
	if s.OutputLimit < minOutputLimit {
		p.add("sandbox.output_limit", "", "%v is below the minimum of %v", s.OutputLimit, minOutputLimit)
	}
	// Root inside the sandbox is refused even though a user namespace would
	// contain it: commands have no business being uid 0, and uid 0 makes
	// every file in the image writable to them.
	if s.User < 1 || s.User > 65535 {
		p.add("sandbox.user", "", "must be a uid from 1 to 65535, got %d", s.User)
	}
	s.validateSeccomp(p)
	if s.Landlock != "auto" && s.Landlock != "require" && s.Landlock != "off" {
		p.add("sandbox.landlock", "", "invalid mode %q (auto, require or off)", s.Landlock)
	}
	s.validatePool(p, languages)
	s.validateCgroupParent(p)
	s.validateUsernsPool(p)
}

// validateSeccomp checks the default profile's name and the extra rules
// of each profile.
func (s *Sandbox) validateSeccomp(p *problems) {
	if s.SeccompProfile != "unconfined" && !plainName.MatchString(s.SeccompProfile) {
		p.add("sandbox.seccomp_profile", "", "invalid profile name %q (a file name in paths.seccomp_dir without .json, or \"unconfined\")", s.SeccompProfile)
	}
	for _, prof := range slices.Sorted(maps.Keys(s.SeccompRules)) {
		key := "sandbox.seccomp_rules." + prof
		if !plainName.MatchString(prof) {
			p.add(key, "", "invalid profile name %q", prof)
		}
		for i, r := range s.SeccompRules[prof] {
			rk := fmt.Sprintf("%s[%d]", key, i)
			switch {
			case len(r.Names) == 0:
				p.add(rk+".names", "", "must name at least one syscall")
			case r.Action != "SCMP_ACT_ALLOW" && r.Action != "SCMP_ACT_ERRNO" && r.Action != "SCMP_ACT_KILL_PROCESS" && r.Action != "SCMP_ACT_LOG":
				p.add(rk+".action", "", "must be SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS or SCMP_ACT_LOG, got %q", r.Action)
			case r.ErrnoRet != 0 && r.Action != "SCMP_ACT_ERRNO":
				p.add(rk+".errno_ret", "", "only valid with SCMP_ACT_ERRNO")
			case r.ErrnoRet < 0 || r.ErrnoRet > 4095:
				p.add(rk+".errno_ret", "", "must be an errno from 1 to 4095, got %d", r.ErrnoRet)
			}
		}
	}
}

// validatePool checks the warm pool: enabled languages, and no more warm
// sandboxes than sandbox.max_sandboxes.
func (s *Sandbox) validatePool(p *problems, languages []string) {
	warm := 0
	for _, lang := range slices.Sorted(maps.Keys(s.Pool)) {
		key, n := "sandbox.pool."+lang, s.Pool[lang]
		switch {
		case !plainName.MatchString(lang):
			p.add(key, "", "invalid language name %q", lang)
		case len(languages) > 0 && !slices.Contains(languages, lang):
			p.add(key, "", "language %q is not enabled in images.languages", lang)
		case n < 0:
			p.add(key, "", "must not be negative, got %d", n)
		}
		warm += max(n, 0)
	}
	if warm > s.MaxSandboxes && s.MaxSandboxes >= 1 {
		p.add("sandbox.pool", "", "%d warm sandboxes exceed sandbox.max_sandboxes %d", warm, s.MaxSandboxes)
	}
}

// validateCgroupParent wants a clean absolute cgroup path other than the
// root: the daemon owns everything below it.
func (s *Sandbox) validateCgroupParent(p *problems) {
	switch {
	case !path.IsAbs(s.CgroupParent):
		p.add("sandbox.cgroup_parent", "", "must be an absolute cgroup path, got %q", s.CgroupParent)
	case s.CgroupParent == "/":
		p.add("sandbox.cgroup_parent", "", "must not be the root cgroup")
	case path.Clean(s.CgroupParent) != s.CgroupParent:
		p.add("sandbox.cgroup_parent", "", "%q is not a clean path (did you mean %q?)", s.CgroupParent, path.Clean(s.CgroupParent))
	}
}

// validateUsernsPool checks the user namespace ranges (count 0: none):
// one per sandbox at least, each reaching nobody and the sandbox user,
// all above the host's accounts and below the largest uid.
func (s *Sandbox) validateUsernsPool(p *problems) {
	if u := s.UsernsPool; u.Count != 0 {
		switch {
		case u.Count < 0:
			p.add("sandbox.userns_pool.count", "", "must not be negative, got %d", u.Count)
		case u.Count < int64(s.MaxSandboxes):
			p.add("sandbox.userns_pool.count", "", "%d ranges are fewer than sandbox.max_sandboxes %d", u.Count, s.MaxSandboxes)
		}
		switch {
		case u.Size <= int64(s.User) || u.Size <= 65534:
			p.add("sandbox.userns_pool.size", "", "must be at least 65535 ids (up to nobody, 65534) and more than sandbox.user, got %d", u.Size)
		case u.Size > 1<<31:
			p.add("sandbox.userns_pool.size", "", "must be at most 2^31, got %d", u.Size)
		}
		switch {
		case u.Base < 65536:
			p.add("sandbox.userns_pool.base", "", "must be at least 65536 (above every system and regular account), got %d", u.Base)
		case u.Count > 0 && u.Size > 0 && u.Size <= 1<<31 && (u.Base+u.Size*u.Count-1 > 1<<32-2 || u.Count > 1<<32):
			p.add("sandbox.userns_pool", "", "base %d + %d ranges of %d ids passes the largest uid 4294967294", u.Base, u.Count, u.Size)
		}
	}
}

// limit checks a default against its floor and against its cap, whose key is
// the default's with "max_" in front of the last element.
func limit[T cmp.Ordered](p *problems, key string, def, capValue, floor T) {
	i := strings.LastIndexByte(key, '.')
	capKey := key[:i+1] + "max_" + key[i+1:]
	switch {
	case def < floor:
		p.add(key, "", "%v is below the minimum of %v", def, floor)
	case def > capValue:
		p.add(key, "", "%v exceeds %s %v", def, capKey, capValue)
	}
}

func (n *Network) validate(p *problems) {
	// Linux interface names: at most IFNAMSIZ-1 bytes, no '/', ':' or spaces
	// (dev_valid_name in the kernel).
	if n.Bridge == "" || len(n.Bridge) > 15 || n.Bridge == "." || n.Bridge == ".." ||
		strings.ContainsAny(n.Bridge, "/: \t\n") {
		p.add("network.bridge", "", "invalid interface name %q (1 to 15 characters, no '/', ':' or spaces)", n.Bridge)
	}
	if pfx, ok := p.cidr("network.subnet", n.Subnet); ok {
		switch {
		case !pfx.Addr().Is4():
			p.add("network.subnet", "", "must be an IPv4 CIDR, got %q", n.Subnet)
		case pfx.Bits() > 30: // the bridge's address and at least one sandbox
			p.add("network.subnet", "", "%q is too small (use a /30 or larger)", n.Subnet)
		}
	}
	p.oneOf("network.default_mode", n.DefaultMode, "none", "egress", "allowlist")
	for i, d := range n.Deny {
		p.cidr(fmt.Sprintf("network.deny[%d]", i), d)
	}
	for i, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			p.add(fmt.Sprintf("network.dns[%d]", i), "", "invalid IP address %q", d)
		}
	}
	if n.MTU != 0 && (n.MTU < 576 || n.MTU > 65535) {
		p.add("network.mtu", "", "%d is outside 576..65535 (0: the kernel's default)", n.MTU)
	}
	n.validateShaping(p)
	n.validatePresets(p)
	n.validateCredentials(p)
}

// validateShaping checks the bandwidth and connection rate defaults
// against their floors and caps.
func (n *Network) validateShaping(p *problems) {
	const minBandwidth = 8 << 10 // below, a single full-size packet takes most of a second
	for _, b := range []struct {
		key string
		v   ByteSize
	}{{"network.bandwidth", n.Bandwidth}, {"network.max_bandwidth", n.MaxBandwidth}} {
		if b.v != 0 && b.v < minBandwidth {
			p.add(b.key, "", "%v is below the minimum of 8KiB per second (0: unlimited)", b.v)
		}
	}
	if n.MaxBandwidth > 0 && (n.Bandwidth == 0 || n.Bandwidth > n.MaxBandwidth) {
		p.add("network.bandwidth", "", "%v (0: unlimited) exceeds network.max_bandwidth %v", n.Bandwidth, n.MaxBandwidth)
	}
	// Bounded above by what a sandbox's resolver waits for one lookup
	// (network.ResolvConf: timeout 10 s, 5 attempts), with a margin.
	if h := time.Duration(n.ApprovalHold); h < time.Second || h > 40*time.Second {
		p.add("network.approval_hold", "", "%v is outside 1s..40s", h)
	}
	if n.ConnRate < 0 || n.MaxConnRate < 0 {
		p.add("network.conn_rate", "", "must not be negative")
	}
	if n.MaxConnRate > 0 && (n.ConnRate == 0 || n.ConnRate > n.MaxConnRate) {
		p.add("network.conn_rate", "", "%d (0: unlimited) exceeds network.max_conn_rate %d", n.ConnRate, n.MaxConnRate)
	}
}

// validatePresets checks the allowlist presets' names and entries and the
// package index URLs.
func (n *Network) validatePresets(p *problems) {
	for _, name := range slices.Sorted(maps.Keys(n.Presets)) {
		if !plainName.MatchString(name) {
			p.add("network.presets."+name, "", "invalid preset name %q", name)
		}
		for i, e := range n.Presets[name] {
			if strings.TrimSpace(e) == "" || strings.HasPrefix(e, "@") {
				p.add(fmt.Sprintf("network.presets.%s[%d]", name, i), "", "want a host name, *.domain or IPv4 CIDR, got %q", e)
			}
		}
	}
	for _, u := range []struct{ key, v string }{
		{"network.package_indexes.pip_index_url", n.PackageIndexes.PipIndexURL},
		{"network.package_indexes.npm_registry", n.PackageIndexes.NpmRegistry},
		{"network.package_indexes.go_proxy", n.PackageIndexes.GoProxy},
	} {
		if u.v != "" {
			p.httpURL(u.key, u.v)
		}
	}
}

// validateCredentials checks the credential proxy's port and each
// credential: a name, an http(s) base URL, a header, exactly one secret
// source, the sandbox's variable, caps not negative.
func (n *Network) validateCredentials(p *problems) {
	if len(n.Credentials) > 0 && (n.CredentialPort <= 0 || n.CredentialPort > 65535 || n.CredentialPort == 53) {
		p.add("network.credential_port", "", "want a TCP port other than 53, got %d", n.CredentialPort)
	}
	for _, name := range slices.Sorted(maps.Keys(n.Credentials)) {
		c, key := n.Credentials[name], "network.credentials."+name
		if !plainName.MatchString(name) {
			p.add(key, "", "invalid credential name %q", name)
		}
		if c.BaseURL == "" {
			p.add(key+".base_url", "", "required")
		} else {
			p.httpURL(key+".base_url", c.BaseURL)
		}
		if c.Header == "" || strings.ContainsAny(c.Header, " :\r\n") {
			p.add(key+".header", "", "want a header name, got %q", c.Header)
		}
		if (c.SecretEnv == "") == (c.SecretFile == "") {
			p.add(key+".secret_env", "", "give exactly one of secret_env and secret_file")
		}
		if c.BaseURLEnv == "" {
			p.add(key+".base_url_env", "", "required (the sandbox's variable naming the proxy's URL)")
		}
		if c.MaxRequests < 0 || c.MaxTokens < 0 {
			p.add(key+".max_requests", "", "caps must not be negative")
		}
	}
}

func (im *Images) validate(p *problems) {
	if im.Mirror != "" {
		p.httpURL("images.mirror", im.Mirror)
	}
	if !plainName.MatchString(im.Suite) {
		p.add("images.suite", "", "invalid suite name %q", im.Suite)
	}
	seen := make(map[string]bool)
	for i, l := range im.Languages {
		key := fmt.Sprintf("images.languages[%d]", i)
		switch {
		case !plainName.MatchString(l):
			p.add(key, "", "invalid language name %q", l)
		case seen[l]:
			p.add(key, "", "language %q listed twice", l)
		}
		seen[l] = true
	}
	if im.MaxSize < 1<<20 {
		p.add("images.max_size", "", "%v is below the minimum of 1MiB", im.MaxSize)
	}
	if im.MaxManifestSize < 4<<10 {
		p.add("images.max_manifest_size", "", "%v is below the minimum of 4KiB", im.MaxManifestSize)
	}
	for i, h := range im.AllowPull {
		if h != "*" && !registryHost.MatchString(h) {
			p.add(fmt.Sprintf("images.allow_pull[%d]", i), "", "%q is neither a registry host[:port] nor *", h)
		}
	}
	for i, h := range im.PrivateRegistries {
		if !registryHost.MatchString(h) {
			p.add(fmt.Sprintf("images.private_registries[%d]", i), "", "%q is not a registry host[:port]", h)
		}
	}
	for i, r := range im.Registries {
		key := fmt.Sprintf("images.registries[%d]", i)
		if !registryHost.MatchString(r.Host) {
			p.add(key+".host", "", "%q is not a registry host[:port]", r.Host)
		}
		if r.Password != "" && r.PasswordEnv != "" {
			p.add(key+".password_env", "", "set password or password_env, not both")
		}
		if r.CAFile != "" {
			p.absPath(key+".ca_file", r.CAFile)
		}
	}
	if im.DockerConfig != "" {
		p.absPath("images.docker_config", im.DockerConfig)
	}
}

// registryHost is a registry as image references name it: a host name or
// IPv4 address, with an optional port.
var registryHost = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$`)

func (r *Runs) validate(p *problems) {
	if r.Dir != "" {
		p.absPath("runs.dir", r.Dir)
	}
	if r.MaxAge < 0 {
		p.add("runs.max_age", "", "must not be negative (0 means never)")
	}
	if r.LogCap < minOutputLimit {
		p.add("runs.log_cap", "", "%v is below the minimum of %v", r.LogCap, minOutputLimit)
	}
}

func (s *Snapshots) validate(p *problems) {
	if s.Dir != "" {
		p.absPath("snapshots.dir", s.Dir)
	}
	if s.MaxAge < 0 {
		p.add("snapshots.max_age", "", "must not be negative (0 means never)")
	}
	if s.MaxSize < 0 {
		p.add("snapshots.max_size", "", "must not be negative (0 means no cap)")
	}
}

func (w *Webhooks) validate(p *problems) {
	for _, c := range w.AllowPrivate {
		p.cidr("webhooks.allow_private", c)
	}
	if w.RetryBase < Duration(100*time.Millisecond) {
		p.add("webhooks.retry_base", "", "%v is below the minimum of 100ms", w.RetryBase)
	}
	if w.RetryMax < w.RetryBase {
		p.add("webhooks.retry_max", "", "must not be below webhooks.retry_base")
	}
	if w.MaxAttempts < 1 || w.MaxAttempts > 100 {
		p.add("webhooks.max_attempts", "", "must be 1 to 100")
	}
	if w.DisableAfter < 1 {
		p.add("webhooks.disable_after", "", "must be at least 1")
	}
	if w.MaxAge <= 0 {
		p.add("webhooks.max_age", "", "must be positive")
	}
	if w.MaxWebhooks < 1 {
		p.add("webhooks.max_webhooks", "", "must be at least 1")
	}
}

func (v *Volumes) validate(p *problems) {
	if v.Dir != "" {
		p.absPath("volumes.dir", v.Dir)
	}
	// 16 MiB: the least ext4 with a journal that still holds files.
	const minVolume = 16 << 20
	if v.MaxSize < minVolume {
		p.add("volumes.max_size", "", "%v is below the minimum of 16M", v.MaxSize)
	}
	if v.DefaultSize < minVolume || v.DefaultSize > v.MaxSize {
		p.add("volumes.default_size", "", "%v must be between 16M and volumes.max_size (%v)", v.DefaultSize, v.MaxSize)
	}
	if v.MaxVolumes < 0 {
		p.add("volumes.max_volumes", "", "must not be negative (0 means no cap)")
	}
	if v.MaxPerSandbox < 0 {
		p.add("volumes.max_per_sandbox", "", "must not be negative (0: sandboxes mount none)")
	}
}

func (a *Autofix) validate(p *problems) {
	p.oneOf("autofix.provider", a.Provider, "client", "sampling", "anthropic", "command", "agent")
	if a.MaxRetriesCap < 1 || a.MaxRetriesCap > 20 {
		p.add("autofix.max_retries_cap", "", "must be between 1 and 20, got %d", a.MaxRetriesCap)
	}
	if a.MaxRetries < 1 || a.MaxRetries > a.MaxRetriesCap {
		p.add("autofix.max_retries", "", "must be between 1 and autofix.max_retries_cap (%d), got %d", a.MaxRetriesCap, a.MaxRetries)
	}
	if a.Timeout <= 0 {
		p.add("autofix.timeout", "", "must be greater than 0")
	}
	if a.MaxTimeout < a.Timeout {
		p.add("autofix.max_timeout", "", "must be at least autofix.timeout (%s)", a.Timeout)
	}
	if a.SessionTTL <= 0 {
		p.add("autofix.session_ttl", "", "must be greater than 0")
	}
	if a.MaxTokens < 1 {
		p.add("autofix.max_tokens", "", "must be at least 1, got %d", a.MaxTokens)
	}
	if a.CommandTimeout <= 0 {
		p.add("autofix.command_timeout", "", "must be greater than 0")
	}
	p.oneOf("autofix.success", a.Success, "exit_zero_and_empty_stderr", "exit_zero", "tests")
	if a.BaseURL != "" {
		p.httpURL("autofix.base_url", a.BaseURL)
	}
	if a.APIKeyEnv != "" && !envName.MatchString(a.APIKeyEnv) {
		p.add("autofix.api_key_env", "", "invalid environment variable name %q", a.APIKeyEnv)
	}
	if a.APIKeyFile != "" {
		p.absPath("autofix.api_key_file", a.APIKeyFile)
	}
	switch a.Provider {
	case "anthropic":
		if a.APIKeyEnv == "" && a.APIKeyFile == "" {
			p.add("autofix.api_key_env", "", "required when autofix.provider is anthropic (or set autofix.api_key_file)")
		}
	case "command":
		if len(a.Command) == 0 {
			p.add("autofix.command", "", "required when autofix.provider is command")
		}
	}
}

func (v *VM) validate(p *problems) {
	if v.QEMU == "" || (strings.ContainsRune(v.QEMU, '/') && !filepath.IsAbs(v.QEMU)) {
		p.add("vm.qemu", "", "must be a program name or an absolute path, got %q", v.QEMU)
	}
	p.oneOf("vm.accel", v.Accel, "auto", "kvm", "tcg")
	for _, name := range slices.Sorted(maps.Keys(v.Images)) {
		key := "vm.images." + name
		if !plainName.MatchString(name) {
			p.add(key, "", "invalid OS name %q", name)
			continue
		}
		p.absPath(key, v.Images[name])
	}
	if v.MaxVMs < 0 {
		p.add("vm.max_vms", "", "must not be negative (0 disables VMs), got %d", v.MaxVMs)
	}
	if v.BootTimeout <= 0 {
		p.add("vm.boot_timeout", "", "must be positive, got %s", v.BootTimeout.D())
	}
}

func (l *Log) validate(p *problems) {
	p.oneOf("log.level", l.Level, "debug", "info", "warn", "error")
	p.oneOf("log.format", l.Format, "json", "text")
}

func (p *problems) absPath(key, v string) {
	switch {
	case v == "":
		p.add(key, "", "required (an absolute path)")
	case !filepath.IsAbs(v):
		p.add(key, "", "must be an absolute path, got %q", v)
	}
}

func (p *problems) oneOf(key, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		p.add(key, "", "invalid value %q (use %s)", v, strings.Join(allowed, ", "))
	}
}

// cidr checks that v is a CIDR without host bits and returns it.
func (p *problems) cidr(key, v string) (netip.Prefix, bool) {
	pfx, err := netip.ParsePrefix(v)
	switch {
	case err != nil:
		p.add(key, "", "invalid CIDR %q (e.g. 10.0.0.0/8)", v)
		return pfx, false
	case pfx != pfx.Masked():
		// 10.1.2.3/8 is almost always a typo for 10.0.0.0/8; guessing
		// either way could open or close more than intended.
		p.add(key, "", "%q has host bits set (did you mean %q?)", v, pfx.Masked().String())
		return pfx, false
	}
	return pfx, true
}

func (p *problems) hostPort(key, v string) {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		p.add(key, "", "invalid address %q (use host:port, e.g. 127.0.0.1:7070)", v)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		p.add(key, "", "invalid port %q (use 1 to 65535)", port)
	}
}

func (p *problems) httpURL(key, v string) {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.add(key, "", "invalid URL %q (use http:// or https://)", v)
	}
}
