package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Resource kinds a Manager records as it acquires them (see Recorder); the
// sandbox ledger calls the matching Release* method for each.
const (
	KindNetNS = "netns" // key: the namespace's bind-mount path
	KindLease = "lease" // key: the sandbox id
	KindNft   = "nft"   // key: the sandbox id
	KindVeth  = "veth"  // key: the host-side veth name
)

// Recorder is told about each piece of a sandbox's network before it is
// acquired (write-ahead, as pkg/ledger wants), so that a crash at any point
// leaves a record naming everything that may exist; releasing a piece that
// does not exist succeeds. nil records nothing.
type Recorder func(kind, key string) error

// Config is the network section as the manager uses it.
type Config struct {
	Bridge string
	Subnet netip.Prefix
	MTU    int // of the bridge and veths; 0: the kernel's default
	// Deny are destinations no sandbox reaches (IPv6 entries are implied:
	// IPv6 is dropped wholesale).
	Deny []netip.Prefix
	// DNS are the upstream resolvers of the forwarder (IP or IP:port);
	// empty: the nameservers of the host's /etc/resolv.conf.
	DNS            []string
	Presets        map[string][]string
	PackageIndexes PackageIndexes
	// RunDir holds the sandboxes' namespace files (RunDir/netns/ID) and
	// the saved ip_forward value.
	RunDir string
	// Owner names the daemon in the marks on its host objects
	// (ownership.go): its state directory; empty: RunDir.
	Owner string
	// Caps on per-sandbox limits; 0: uncapped.
	MaxBandwidthBytes uint64
	MaxConnPerSecond  uint32
	// Credentials are the upstream APIs the credential proxy serves, by
	// name; CredentialPort is its port on the gateway.
	Credentials    map[string]Credential
	CredentialPort int
	// ApprovalHold bounds how long the DNS forwarder holds a refused
	// lookup while a Watch's Approve decides (network.approval_hold);
	// 0: DefaultApprovalHold.
	ApprovalHold time.Duration
	Log          *slog.Logger
}

// Request is a sandbox's network as asked for.
type Request struct {
	Policy   Policy
	Limits   Limits
	Hostname string // for /etc/hosts; empty: "sandbox"
	// Credentials names the credentials the sandbox may use through the
	// credential proxy (egress and allowlist modes only).
	Credentials []string
}

// Attachment is what the runtime needs to start a sandbox in its network.
type Attachment struct {
	NetNSPath  string     // join this network namespace
	IP         netip.Addr // invalid in ModeNone
	Gateway    netip.Addr // invalid in ModeNone
	ResolvConf []byte     // /etc/resolv.conf
	Hosts      []byte     // /etc/hosts
	// Env is the sandbox's environment from its network (KEY=value):
	// package index variables, and for each credential the proxy's URL
	// and a dummy key.
	Env []string
}

// Status is a sandbox's network as reported to clients.
type Status struct {
	Mode     Mode     `json:"mode"`
	Allow    []string `json:"allow"`
	Counters Counters `json:"counters"`
}

// sandboxNet is one sandbox known to the manager.
type sandboxNet struct {
	id, key, nsPath string
	req             Request
	rules           *rules
	ip              netip.Addr        // valid while connected
	refused         []string          // recent refused DNS names, newest last
	grants          map[string]*grant // credentials, by name (guarded by dnsMu)
	// watches and held are the calls watching the sandbox's refusals and
	// the refused names whose lookups are held for one (approve.go);
	// guarded by dnsMu.
	watches []*watchEntry
	held    map[string]*heldName
}

// maxDeniedNames bounds the refused DNS names kept per sandbox.
const maxDeniedNames = 16

// Manager owns the network of every sandbox and the host side they share.
// It is safe for concurrent use.
type Manager struct {
	cfg    Config
	hostNS netns.NsHandle
	host   *netlink.Handle
	leases *store.Store
	fw     *firewall
	gw     netip.Prefix
	log    *slog.Logger
	mark   string             // hostclaim.Mark of the daemon
	claims []*hostclaim.Claim // of the bridge and range, while the manager lives

	mu        sync.Mutex
	sandboxes map[string]*sandboxNet
	dns       *dnsForwarder    // non-nil while the host side is up
	cred      *credentialProxy // non-nil while the host side is up, if credentials are configured
	credKey   []byte           // HMAC key of per-sandbox tokens

	// dnsMu guards byIP and the rules and refused names of sandboxes,
	// which the DNS forwarder reads. The forwarder never takes mu: the
	// host side is stopped under mu, and stopping waits for the
	// forwarder's handlers.
	dnsMu sync.RWMutex
	byIP  map[netip.Addr]*sandboxNet
}

// New makes a manager whose host side lives in hostNS (the daemon's own
// namespace in production; the manager does not close it). It checks the
// configuration against the namespace's routes but creates nothing until
// the first sandbox with network.
func New(cfg Config, hostNS netns.NsHandle, leases *store.Store) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 30 {
		return nil, errdefs.Invalidf("network.subnet: want an IPv4 CIDR of /30 or larger, got %q", cfg.Subnet)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if err := checkPresets(cfg.Presets); err != nil {
		return nil, err
	}
	if cfg.RunDir == "" || !filepath.IsAbs(cfg.RunDir) {
		return nil, errdefs.Invalidf("paths.run_dir: must be an absolute path, got %q", cfg.RunDir)
	}
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return nil, fmt.Errorf("network: netlink in the host namespace: %w", err)
	}
	if cfg.Owner == "" {
		cfg.Owner = cfg.RunDir
	}
	mark := hostclaim.Mark(cfg.Owner)
	m := &Manager{cfg: cfg, hostNS: hostNS, host: h, leases: leases, fw: newFirewall(hostNS, cfg.Bridge, mark),
		log: cfg.Log, mark: mark, sandboxes: map[string]*sandboxNet{}, byIP: map[netip.Addr]*sandboxNet{}}
	m.gw = netip.PrefixFrom(cfg.Subnet.Addr().Next(), cfg.Subnet.Bits())
	if err := m.claimNames(); err != nil {
		m.releaseClaims()
		h.Close()
		return nil, err
	}
	if err := m.checkSubnet(); err != nil {
		m.releaseClaims()
		h.Close()
		return nil, err
	}
	if len(m.cfg.DNS) == 0 {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err == nil {
			for _, s := range cc.Servers {
				m.cfg.DNS = append(m.cfg.DNS, s+":"+cc.Port)
			}
		}
	}
	for i, s := range m.cfg.DNS {
		m.cfg.DNS[i] = upstreamAddr(s)
	}
	if len(cfg.Credentials) > 0 {
		if cfg.CredentialPort <= 0 || cfg.CredentialPort > 65535 || cfg.CredentialPort == 53 {
			m.releaseClaims()
			h.Close()
			return nil, errdefs.Invalidf("network.credential_port: want a TCP port other than 53, got %d", cfg.CredentialPort)
		}
		if m.credKey, err = credentialKey(cfg.RunDir); err != nil {
			m.releaseClaims()
			h.Close()
			return nil, fmt.Errorf("network: credential proxy key: %w", err)
		}
	}
	return m, nil
}

// Close releases the manager's handles; the network stays as it is (a
// restarted daemon adopts it).
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopServersLocked()
	m.releaseClaims()
	m.host.Close()
}

// Table is the name of the daemon's nftables table (TableName).
func (m *Manager) Table() string { return m.fw.table.Name }

// checkSubnet refuses a subnet that overlaps a route of the host namespace
// other than the bridge's own: sandboxes would shadow, or be shadowed by,
// a network the host reaches.
func (m *Manager) checkSubnet() error {
	routes, err := m.host.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("network: list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		p := netip.PrefixFrom(dst, maskBits(r.Dst.Mask))
		if p.Bits() == 0 {
			continue // the default route overlaps everything
		}
		dev, alias := "", ""
		if l, err := m.host.LinkByIndex(r.LinkIndex); err == nil {
			dev, alias = l.Attrs().Name, l.Attrs().Alias
		}
		if dev == m.cfg.Bridge {
			continue
		}
		if !p.Overlaps(m.cfg.Subnet) {
			continue
		}
		if strings.HasPrefix(alias, hostclaim.MarkPrefix) {
			// Another daemon's range: refused at start, like its names.
			return &hostclaim.MarkedError{Setting: "network.subnet", Object: fmt.Sprintf("the range %s (bridge %s), which %s overlaps,", p, dev, m.cfg.Subnet), Mark: alias}
		}
		return errdefs.Invalidf("network.subnet: %s overlaps the host's route to %s (dev %s)", m.cfg.Subnet, p, dev)
	}
	return nil
}

// Validate checks a request without acting on it; errors name the field
// (network, allow, network_bandwidth, network_conn_rate).
func (m *Manager) Validate(req Request) error {
	_, err := m.compile(req)
	return err
}

func (m *Manager) compile(req Request) (*rules, error) {
	r, err := compile("allow", req.Policy, m.cfg.Presets)
	if err != nil {
		return nil, err
	}
	if c := m.cfg.MaxBandwidthBytes; c > 0 && req.Limits.BandwidthBytes > c {
		return nil, errdefs.LimitExceededf("network_bandwidth: %d bytes/s exceeds network.max_bandwidth %d", req.Limits.BandwidthBytes, c)
	}
	if c := m.cfg.MaxConnPerSecond; c > 0 && req.Limits.ConnPerSecond > c {
		return nil, errdefs.LimitExceededf("network_conn_rate: %d/s exceeds network.max_conn_rate %d", req.Limits.ConnPerSecond, c)
	}
	if req.Limits.BandwidthBytes > 0 && req.Limits.BandwidthBytes < 8<<10 {
		return nil, errdefs.Invalidf("network_bandwidth: %d bytes/s is below the minimum of 8 KiB/s", req.Limits.BandwidthBytes)
	}
	if err := checkCredentials("credentials", req.Credentials, r.mode, m.cfg.Credentials); err != nil {
		return nil, err
	}
	if req.Hostname != "" && !validHostname(req.Hostname) {
		return nil, errdefs.Invalidf("hostname: invalid host name %q", req.Hostname)
	}
	return r, nil
}

func checkID(id string) error {
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return errdefs.Invalidf("sandbox_id: invalid sandbox id %q", id)
	}
	return nil
}

// NetNSPath is where a sandbox's namespace is bind-mounted.
func (m *Manager) NetNSPath(id string) string { return filepath.Join(m.cfg.RunDir, "netns", id) }

// Attach gives sandbox id its network: a namespace (in every mode, so the
// mode can change later), and in egress and allowlist modes an address,
// rules, and a veth pair to the bridge, bringing the host side up first if
// this is the first such sandbox. On failure everything acquired is
// released again. Attach on a sandbox already attached adopts what exists
// (a restarted daemon).
func (m *Manager) Attach(ctx context.Context, id string, req Request, rec Recorder) (a *Attachment, err error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	r, err := m.compile(req)
	if err != nil {
		return nil, err
	}
	rec = orNop(rec)
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := &sandboxNet{id: id, key: sandboxKey(id), nsPath: m.NetNSPath(id), req: req, rules: r}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.detachLocked(ctx, id))
		}
	}()
	if err := rec(KindNetNS, sb.nsPath); err != nil {
		return nil, err
	}
	// The sandbox's sysctls (low ports, SandboxSysctls) go in as the
	// namespace is made, before the sandbox can join it.
	if err := CreateNetNS(sb.nsPath, SandboxSysctls()); err != nil {
		return nil, fmt.Errorf("network: namespace of %s: %w", id, err)
	}
	ns, err := netns.GetFromPath(sb.nsPath)
	if err != nil {
		return nil, fmt.Errorf("network: open %s: %w", sb.nsPath, err)
	}
	defer ns.Close()
	if err := bringUpLoopback(ns); err != nil {
		return nil, fmt.Errorf("network: loopback of %s: %w", id, err)
	}
	m.sandboxes[id] = sb
	if r.mode != ModeNone {
		if err := m.connectLocked(ctx, sb, ns, rec); err != nil {
			return nil, err
		}
		if len(req.Credentials) > 0 {
			if err := rec(KindCredential, id); err != nil {
				return nil, err
			}
			m.grantLocked(sb)
		}
	}
	return m.attachment(sb), nil
}

func (m *Manager) attachment(sb *sandboxNet) *Attachment {
	a := &Attachment{NetNSPath: sb.nsPath, Env: m.cfg.PackageIndexes.Env()}
	host := sb.req.Hostname
	if host == "" {
		host = "sandbox"
	}
	if sb.ip.IsValid() {
		a.IP, a.Gateway = sb.ip, m.gw.Addr()
		a.ResolvConf = ResolvConf(m.gw.Addr())
		a.Env = append(a.Env, m.credentialEnv(sb.id, sb.req.Credentials)...)
	} else {
		a.ResolvConf = ResolvConf(netip.Addr{})
	}
	a.Hosts = Hosts(host, sb.ip)
	return a
}

func orNop(rec Recorder) Recorder {
	if rec == nil {
		return func(string, string) error { return nil }
	}
	return rec
}

// connectLocked joins a sandbox to the bridge.
func (m *Manager) connectLocked(ctx context.Context, sb *sandboxNet, ns netns.NsHandle, rec Recorder) error {
	rec = orNop(rec)
	br, err := m.hostUpLocked()
	if err != nil {
		return err
	}
	if err := rec(KindLease, sb.id); err != nil {
		return err
	}
	ipText, err := m.leases.AcquireLease(ctx, sb.id, m.pickAddress)
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "network: no address for the sandbox")
	}
	ip, err := netip.ParseAddr(ipText)
	if err != nil || !m.cfg.Subnet.Contains(ip) {
		return fmt.Errorf("network: lease %q of %s is not in %s", ipText, sb.id, m.cfg.Subnet)
	}
	// Rules before the link: from its first packet the sandbox's traffic
	// meets its own chain.
	if err := rec(KindNft, sb.id); err != nil {
		return err
	}
	if err := m.fw.setSandbox(sandboxRules{key: sb.key, ip: ip, rules: sb.rules, limits: sb.req.Limits}); err != nil {
		return err
	}
	veth := hostVethName(sb.id)
	if err := rec(KindVeth, veth); err != nil {
		return err
	}
	if _, err := m.host.LinkByName(veth); err != nil {
		if err := connectVeth(m.host, vethSpec{hostName: veth, bridge: br, sandbox: ns,
			addr: netip.PrefixFrom(ip, m.cfg.Subnet.Bits()), gateway: m.gw.Addr(), mtu: m.cfg.MTU, limits: sb.req.Limits,
			mark: m.mark}); err != nil {
			return errors.Join(err, deleteLink(m.host, veth))
		}
	}
	sb.ip = ip
	m.dnsMu.Lock()
	m.byIP[ip] = sb
	m.dnsMu.Unlock()
	return nil
}

// pickAddress returns the lowest free address of the subnet after the
// gateway, short of the broadcast address.
func (m *Manager) pickAddress(used map[string]bool) (string, error) {
	for a := m.gw.Addr().Next(); m.cfg.Subnet.Contains(a); a = a.Next() {
		if !m.cfg.Subnet.Contains(a.Next()) {
			break // the broadcast address
		}
		if !used[a.String()] {
			return a.String(), nil
		}
	}
	return "", errdefs.LimitExceededf("network.subnet: every address of %s is leased", m.cfg.Subnet)
}

// hostUpLocked brings up the shared host side: the bridge with the
// gateway address, ip_forward, the table, the DNS forwarder.
func (m *Manager) hostUpLocked() (netlink.Link, error) {
	if m.dns == nil {
		// Another daemon's range may have appeared since New (its bridge
		// is made with its first sandbox): never shadow it.
		if err := m.checkSubnet(); err != nil {
			return nil, err
		}
	}
	br, err := ensureBridge(m.host, m.cfg.Bridge, m.gw, m.cfg.MTU, m.mark)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if m.dns != nil {
		return br, nil
	}
	uplink, err := defaultRouteLink(m.host)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "network: no default route on the host to send sandbox traffic out of")
	}
	if err := m.forwardOn(); err != nil {
		return nil, err
	}
	credPort := 0
	if len(m.cfg.Credentials) > 0 {
		credPort = m.cfg.CredentialPort
	}
	if err := m.fw.install(m.gw.Addr(), m.cfg.Subnet, uplink, m.cfg.Deny, credPort); err != nil {
		return nil, err
	}
	if credPort > 0 {
		p, err := startCredentialProxy(m, m.hostNS, m.gw.Addr(), credPort)
		if err != nil {
			return nil, err
		}
		m.cred = p
	}
	d, err := startDNS(m.hostNS, m.gw.Addr(), m.cfg.DNS, m, m.log)
	if err != nil {
		if m.cred != nil {
			m.cred.stop()
			m.cred = nil
		}
		return nil, err
	}
	m.dns = d
	return br, nil
}

// stopServersLocked stops the DNS forwarder and the credential proxy.
func (m *Manager) stopServersLocked() {
	// Stopping waits for the forwarder's handlers: held lookups first.
	m.dnsMu.Lock()
	for _, sb := range m.sandboxes {
		releaseHeldLocked(sb)
	}
	m.dnsMu.Unlock()
	if m.dns != nil {
		m.dns.stop()
		m.dns = nil
	}
	if m.cred != nil {
		m.cred.stop()
		m.cred = nil
	}
}

// forwardFile keeps the value net.ipv4.ip_forward had before the first
// sandbox with network, so that it is restored even by a daemon that
// restarted in between.
func (m *Manager) forwardFile() string {
	return filepath.Join(m.cfg.RunDir, "network-ip_forward.saved")
}

func (m *Manager) forwardOn() error {
	old, err := readSysctl(m.hostNS, "net/ipv4/ip_forward")
	if err != nil {
		return fmt.Errorf("network: read ip_forward: %w", err)
	}
	if old == "1" {
		return nil
	}
	if _, err := os.Stat(m.forwardFile()); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(m.forwardFile(), []byte(old), 0o600); err != nil {
			return err
		}
	}
	if _, err := writeSysctl(m.hostNS, "net/ipv4/ip_forward", "1"); err != nil {
		return fmt.Errorf("network: enable ip_forward: %w", err)
	}
	return nil
}

func (m *Manager) forwardRestore() error {
	// Another daemon's sandboxes still need forwarding (it found it on
	// and saved nothing): keep the saved value for our next time down.
	if other := m.otherDaemonBridge(); other != "" {
		m.log.Info("network: ip_forward stays on for another daemon's bridge", "bridge", other)
		return nil
	}
	b, err := os.ReadFile(m.forwardFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := writeSysctl(m.hostNS, "net/ipv4/ip_forward", string(trimNL(b))); err != nil {
		return fmt.Errorf("network: restore ip_forward: %w", err)
	}
	return os.Remove(m.forwardFile())
}

// hostDownLocked takes the host side down once no sandbox holds a lease.
func (m *Manager) hostDownLocked(ctx context.Context) error {
	leases, err := m.leases.ListLeases(ctx)
	if err != nil {
		return err
	}
	if len(leases) > 0 {
		return nil
	}
	m.stopServersLocked()
	return errors.Join(m.fw.remove(), m.deleteBridge(), m.forwardRestore())
}

// deleteBridge deletes the bridge if it is ours: it carries our mark, or
// no mark and the gateway address (made by a daemon older than the marks).
// A bridge of the same name without either is someone else's.
func (m *Manager) deleteBridge() error {
	br, err := m.host.LinkByName(m.cfg.Bridge)
	if err != nil {
		return nil // gone already
	}
	switch br.Attrs().Alias {
	case m.mark:
		return deleteLink(m.host, m.cfg.Bridge)
	case "":
	default:
		return nil
	}
	addrs, err := m.host.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == m.gw.Addr() {
			return deleteLink(m.host, m.cfg.Bridge)
		}
	}
	return nil
}

// disconnectLocked undoes connectLocked; idempotent, and works from the
// sandbox id alone (after a restart nothing may be in memory).
func (m *Manager) disconnectLocked(ctx context.Context, id string) error {
	m.unmapLocked(id)
	err := errors.Join(m.ReleaseVeth(hostVethName(id)), m.fw.removeSandbox(sandboxKey(id)), m.leases.ReleaseLease(ctx, id))
	return errors.Join(err, m.hostDownLocked(ctx))
}

// unmapLocked forgets a sandbox's address for the DNS forwarder.
func (m *Manager) unmapLocked(id string) {
	sb := m.sandboxes[id]
	if sb == nil || !sb.ip.IsValid() {
		return
	}
	m.dnsMu.Lock()
	delete(m.byIP, sb.ip)
	releaseHeldLocked(sb)
	m.dnsMu.Unlock()
	sb.ip = netip.Addr{}
}

// setRulesLocked replaces a sandbox's request and compiled rules.
func (m *Manager) setRulesLocked(sb *sandboxNet, r *rules, req Request) {
	m.dnsMu.Lock()
	sb.rules, sb.req = r, req
	m.dnsMu.Unlock()
}

func (m *Manager) detachLocked(ctx context.Context, id string) error {
	err := errors.Join(m.disconnectLocked(ctx, id), RemoveNetNS(m.NetNSPath(id)))
	delete(m.sandboxes, id)
	return err
}

// Detach releases everything of sandbox id's network, and the host side
// if it was the last sandbox with network. Idempotent.
func (m *Manager) Detach(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.detachLocked(ctx, id)
}

// Release methods, one per resource kind, for the sandbox ledger. Each is
// idempotent.

// ReleaseNetNS unmounts and removes a namespace file, and forgets the
// sandbox it belonged to (its other pieces are released before it).
func (m *Manager) ReleaseNetNS(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, sb := range m.sandboxes {
		if sb.nsPath == path {
			m.unmapLocked(id)
			delete(m.sandboxes, id)
		}
	}
	return RemoveNetNS(path)
}

// ReleaseVeth deletes a host-side veth (its peer goes with it).
func (m *Manager) ReleaseVeth(name string) error { return deleteLink(m.host, name) }

// ReleaseRules removes a sandbox's rules, sets and counters.
func (m *Manager) ReleaseRules(id string) error { return m.fw.removeSandbox(sandboxKey(id)) }

// ReleaseLease frees a sandbox's address, and takes the host side down if
// no lease is left.
func (m *Manager) ReleaseLease(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unmapLocked(id)
	return errors.Join(m.leases.ReleaseLease(ctx, id), m.hostDownLocked(ctx))
}

// SetPolicy changes a running sandbox's mode and allowlist: the sandbox
// is connected or disconnected as the mode requires, and otherwise its
// rules are replaced in one nftables transaction. Addresses resolved under
// the old list stay allowed until their TTL runs out. rec is told about
// pieces acquired when a none sandbox gets connected.
func (m *Manager) SetPolicy(ctx context.Context, id string, p Policy, rec Recorder) (Status, error) {
	m.mu.Lock()
	sb := m.sandboxes[id]
	if sb == nil {
		m.mu.Unlock()
		return Status{}, errdefs.NotFoundf("sandbox_id: sandbox %s has no network", id)
	}
	req := sb.req
	req.Policy = p
	r, err := m.compile(req)
	if err != nil {
		m.mu.Unlock()
		return Status{}, err
	}
	old := sb.rules.mode
	switch {
	case old == ModeNone && r.mode != ModeNone:
		ns, err := netns.GetFromPath(sb.nsPath)
		if err != nil {
			m.mu.Unlock()
			return Status{}, fmt.Errorf("network: open %s: %w", sb.nsPath, err)
		}
		m.setRulesLocked(sb, r, req)
		err = m.connectLocked(ctx, sb, ns, rec)
		ns.Close()
		if err != nil {
			req.Policy = Policy{Mode: ModeNone}
			m.setRulesLocked(sb, &rules{mode: ModeNone}, req)
			err = errors.Join(err, m.disconnectLocked(ctx, id))
			m.mu.Unlock()
			return Status{}, err
		}
	case old != ModeNone && r.mode == ModeNone:
		m.setRulesLocked(sb, r, req)
		if err := m.disconnectLocked(ctx, id); err != nil {
			m.mu.Unlock()
			return Status{}, err
		}
	case r.mode != ModeNone:
		if err := m.fw.setSandbox(sandboxRules{key: sb.key, ip: sb.ip, rules: r, limits: req.Limits}); err != nil {
			m.mu.Unlock()
			return Status{}, err
		}
		m.setRulesLocked(sb, r, req)
	default:
		m.setRulesLocked(sb, r, req)
	}
	m.mu.Unlock()
	return m.Status(id)
}

// Status reports a sandbox's mode, list and counters.
func (m *Manager) Status(id string) (Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.sandboxes[id]
	if sb == nil {
		return Status{}, errdefs.NotFoundf("sandbox_id: sandbox %s has no network", id)
	}
	st := Status{Mode: sb.rules.mode, Allow: slices.Clone(sb.rules.allowText)}
	if st.Allow == nil {
		st.Allow = []string{}
	}
	if sb.ip.IsValid() {
		c, err := m.fw.counters(sb.key)
		if err != nil {
			return Status{}, err
		}
		st.Counters = c
	}
	m.dnsMu.RLock()
	st.Counters.DeniedDestinations = append(st.Counters.DeniedDestinations, sb.refused...)
	m.dnsMu.RUnlock()
	if st.Counters.DeniedDestinations == nil {
		st.Counters.DeniedDestinations = []string{}
	}
	return st, nil
}

// policyFor, allowResolved, refusedName and hold (approve.go) serve the
// DNS forwarder.

func (m *Manager) policyFor(src netip.Addr) (string, *rules, bool) {
	m.dnsMu.RLock()
	defer m.dnsMu.RUnlock()
	sb := m.byIP[src]
	if sb == nil {
		return "", nil, false
	}
	return sb.key, sb.rules, true
}

func (m *Manager) allowResolved(key string, addrs map[netip.Addr]time.Duration) error {
	return m.fw.allowAddrs(key, addrs)
}

func (m *Manager) refusedName(src netip.Addr, name string) {
	m.dnsMu.Lock()
	sb := m.byIP[src]
	if sb == nil {
		m.dnsMu.Unlock()
		return
	}
	sb.refused = slices.DeleteFunc(sb.refused, func(s string) bool { return s == name })
	sb.refused = append(sb.refused, name)
	if len(sb.refused) > maxDeniedNames {
		sb.refused = sb.refused[len(sb.refused)-maxDeniedNames:]
	}
	fns := m.refusalWatchers(sb)
	m.dnsMu.Unlock()
	for _, fn := range fns {
		fn(name)
	}
}

// GCReport lists what GC removed.
type GCReport struct {
	Leases     []string `json:"leases,omitempty"`     // sandbox ids
	Veths      []string `json:"veths,omitempty"`      // link names
	Rules      []string `json:"rules,omitempty"`      // sandbox keys
	Namespaces []string `json:"namespaces,omitempty"` // paths
	HostSide   bool     `json:"host_side,omitempty"`  // table, bridge and ip_forward
}

// GC removes network pieces of sandboxes that are not live: leases, host
// veths of ours (ownedVeth: never another daemon's), per-sandbox rules of
// our table, namespace files of our run directory; and the host side when
// no sandbox with network is left.
func (m *Manager) GC(ctx context.Context, live func(id string) bool) (GCReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var rep GCReport
	var errs []error
	keep := map[string]bool{} // veth names and keys of live sandboxes
	leases, err := m.leases.ListLeases(ctx)
	if err != nil {
		return rep, err
	}
	for _, l := range leases {
		if live(l.SandboxID) {
			keep[hostVethName(l.SandboxID)], keep[sandboxKey(l.SandboxID)] = true, true
			continue
		}
		errs = append(errs, m.leases.ReleaseLease(ctx, l.SandboxID))
		rep.Leases = append(rep.Leases, l.SandboxID)
	}
	for id := range m.sandboxes {
		if live(id) {
			keep[hostVethName(id)], keep[sandboxKey(id)] = true, true
		} else {
			m.unmapLocked(id)
			delete(m.sandboxes, id)
		}
	}
	links, err := m.host.LinkList()
	if err != nil {
		return rep, err
	}
	brIndex := -1
	for _, l := range links {
		if l.Attrs().Name == m.cfg.Bridge {
			brIndex = l.Attrs().Index
		}
	}
	for _, l := range links {
		n := l.Attrs().Name
		if ownedVeth(l, m.mark, brIndex) && !keep[n] {
			errs = append(errs, deleteLink(m.host, n))
			rep.Veths = append(rep.Veths, n)
		}
	}
	keys, err := m.fw.sandboxKeys()
	errs = append(errs, err)
	for _, k := range keys {
		if !keep[k] {
			errs = append(errs, m.fw.removeSandbox(k))
			rep.Rules = append(rep.Rules, k)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(m.cfg.RunDir, "netns"))
	for _, e := range entries {
		if !live(e.Name()) {
			p := filepath.Join(m.cfg.RunDir, "netns", e.Name())
			errs = append(errs, RemoveNetNS(p))
			rep.Namespaces = append(rep.Namespaces, p)
		}
	}
	if !slices.ContainsFunc(leases, func(l store.Lease) bool { return live(l.SandboxID) }) {
		up, _ := m.fw.exists()
		_, brErr := m.host.LinkByName(m.cfg.Bridge) // reported even if not ours, harmless
		_, fwdErr := os.Stat(m.forwardFile())
		rep.HostSide = up || brErr == nil || fwdErr == nil
		errs = append(errs, m.hostDownLocked(ctx))
	}
	return rep, errors.Join(errs...)
}

// Connected lists the sandboxes joined to the bridge (egress or
// allowlist), sorted.
func (m *Manager) Connected() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id, sb := range m.sandboxes {
		if sb.ip.IsValid() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
