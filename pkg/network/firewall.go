package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
)

// DefaultTable is the nftables table (family inet) of the daemon on the
// default bridge. Nothing else in the namespace is touched: the base
// chains hook in with policy accept and match only traffic of the bridge,
// so the host's own rules, and other daemons' tables, keep working.
const DefaultTable = "mcp_sandboxd"

// DefaultBridge is network.bridge's default (pkg/config).
const DefaultBridge = "sbx0"

// TableName is the nftables table of the daemon whose bridge is bridge:
// DefaultTable on the default bridge (the one table of every daemon
// before several could share a host, so an upgraded daemon adopts it),
// DefaultTable_<bridge> otherwise. A bridge is one daemon's (see
// hostclaim), so its table is too.
func TableName(bridge string) string {
	if bridge == DefaultBridge {
		return DefaultTable
	}
	return DefaultTable + "_" + bridge
}

// Fixed chain and set names of the table; per-sandbox objects carry the
// sandbox's key (sandboxKey) after a prefix.
const (
	chainForward     = "forward"
	chainInput       = "input"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
	chainFromSandbox = "from_sandbox"
	chainToSandbox   = "to_sandbox"
	chainToHost      = "sandbox_to_host"
	setDeny          = "deny"
	// chainOwner holds one rule (return, never jumped to) whose comment
	// is the owner mark (hostclaim.Mark): nftables tables carry no
	// comment our library reads, rules do. `nft list table` shows it.
	chainOwner    = "owner"
	chainDispatch = "dispatch" // per sandbox: source address → jump to its chain

	prefixSandboxChain = "sb_"
	prefixAllowDNS     = "allowdns_" // addresses allowed names resolved to, with timeouts
	prefixAllowNet     = "allownet_" // allowed CIDRs
	prefixDenied       = "denied_"   // recent denied destinations, bounded
	prefixAllowedCtr   = "allowed_"
	prefixDeniedCtr    = "denied_"

	// deniedSetSize bounds the denied destinations kept per sandbox: the
	// kernel stops adding to a full set, so a sandbox scanning the
	// internet cannot grow it.
	deniedSetSize = 32
	// deniedTimeout is how long a denied destination is remembered.
	deniedTimeout = time.Hour
	// minDNSTimeout is the least time an address an allowed name resolved
	// to stays allowed: resolvers and clients cache answers for their TTL
	// and some beyond, and a TTL of 0 would otherwise leave no time to
	// connect at all.
	minDNSTimeout = 60 * time.Second
	// maxDNSTimeout caps it, so an address that changed owner leaves the
	// set within the hour whatever TTL the upstream claimed.
	maxDNSTimeout = time.Hour
)

// firewall is the daemon's nftables table in one network namespace.
type firewall struct {
	ns     netns.NsHandle
	table  *nftables.Table
	bridge string
	mark   string // hostclaim.Mark of the daemon
}

func newFirewall(ns netns.NsHandle, bridge, mark string) *firewall {
	return &firewall{ns: ns, bridge: bridge, mark: mark,
		table: &nftables.Table{Name: TableName(bridge), Family: nftables.TableFamilyINet}}
}

func (f *firewall) conn() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(f.ns)))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return c, nil
}

// exists reports whether the table is there.
func (f *firewall) exists() (bool, error) {
	c, err := f.conn()
	if err != nil {
		return false, err
	}
	_, err = c.ListTableOfFamily(f.table.Name, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// remove deletes the table and everything in it. Idempotent.
func (f *firewall) remove() error {
	ok, err := f.exists()
	if err != nil || !ok {
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	c.DelTable(f.table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s: %w", f.table.Name, err)
	}
	return nil
}

// owner returns the owner mark of the table: "" if it has none (made by a
// daemon older than the marks), and exists false if there is no table.
func (f *firewall) owner() (mark string, exists bool, err error) {
	if ok, err := f.exists(); err != nil || !ok {
		return "", false, err
	}
	c, err := f.conn()
	if err != nil {
		return "", false, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", true, fmt.Errorf("nftables: chains of %s: %w", f.table.Name, err)
	}
	if !slices.ContainsFunc(chains, func(ch *nftables.Chain) bool { return ch.Table.Name == f.table.Name && ch.Name == chainOwner }) {
		return "", true, nil
	}
	rules, err := c.GetRules(f.table, &nftables.Chain{Name: chainOwner, Table: f.table})
	if err != nil {
		return "", true, fmt.Errorf("nftables: %s of %s: %w", chainOwner, f.table.Name, err)
	}
	for _, r := range rules {
		if m, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && m != "" {
			return m, true, nil
		}
	}
	return "", true, nil
}

// claim makes sure an existing table is ours: marked with our mark, or
// unmarked (a table of a daemon older than the marks, which is adopted
// and marked). A table another daemon marked is refused: its sandboxes
// may still run.
func (f *firewall) claim() error {
	mark, exists, err := f.owner()
	switch {
	case err != nil || !exists || mark == f.mark:
		return err
	case mark != "":
		return &hostclaim.MarkedError{Setting: "network.bridge", Object: "nftables table inet " + f.table.Name, Mark: mark}
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	f.addOwner(c)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: mark %s as ours: %w", f.table.Name, err)
	}
	return nil
}

// addOwner adds the owner chain and its marked rule.
func (f *firewall) addOwner(c *nftables.Conn) {
	ch := c.AddChain(&nftables.Chain{Name: chainOwner, Table: f.table})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: verdict(expr.VerdictReturn),
		UserData: userdata.AppendString(nil, userdata.TypeComment, f.mark)})
}

// install creates the table with its base chains and owner mark, or
// leaves it as it is if it exists and is ours (a restarted daemon keeps
// its sandboxes' rules). gw is the bridge's address, subnet the
// sandboxes', uplink the interface of the default route (masquerade),
// deny the destinations no sandbox reaches.
func (f *firewall) install(gw netip.Addr, subnet netip.Prefix, uplink string, deny []netip.Prefix, credPort int) error {
	if ok, err := f.exists(); err != nil || ok {
		if err == nil {
			err = f.claim()
		}
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	t := c.AddTable(f.table)
	f.addOwner(c)

	denySet := &nftables.Set{Table: t, Name: setDeny, KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(denySet, intervalElements(deny)); err != nil {
		return fmt.Errorf("nftables: deny set: %w", err)
	}
	ch := addChains(c, t)
	rule := func(chain *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
	}
	f.sandboxRules(rule, ch)
	f.hostRules(rule, ch, gw, subnet, uplink, credPort)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: create table %s: %w", f.table.Name, err)
	}
	return nil
}

// tableChains are the table's chains that install adds rules to.
type tableChains struct {
	fwd, in, out, post *nftables.Chain // base chains (policy accept)
	from, to, toHost   *nftables.Chain
}

// addChains adds the table's base chains (hooked, policy accept) and its
// regular ones (dispatch is filled per sandbox).
func addChains(c *nftables.Conn, t *nftables.Table) tableChains {
	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	}
	ch := tableChains{
		fwd:    base(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter),
		in:     base(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter),
		out:    base(chainOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter),
		post:   base(chainPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource),
		from:   c.AddChain(&nftables.Chain{Name: chainFromSandbox, Table: t}),
		to:     c.AddChain(&nftables.Chain{Name: chainToSandbox, Table: t}),
		toHost: c.AddChain(&nftables.Chain{Name: chainToHost, Table: t}),
	}
	c.AddChain(&nftables.Chain{Name: chainDispatch, Table: t})
	return ch
}

// sandboxRules adds the rules of traffic through the bridge: what enters
// our chains, and the from_sandbox and to_sandbox chains.
func (f *firewall) sandboxRules(rule func(*nftables.Chain, ...expr.Any), ch tableChains) {
	// Only the bridge's traffic enters our chains; everything else passes
	// the base chains untouched (policy accept).
	rule(ch.fwd, cat(matchIfname(expr.MetaKeyIIFNAME, f.bridge), jump(chainFromSandbox))...)
	rule(ch.fwd, cat(matchIfname(expr.MetaKeyOIFNAME, f.bridge), jump(chainToSandbox))...)
	rule(ch.in, cat(matchIfname(expr.MetaKeyIIFNAME, f.bridge), jump(chainToHost))...)

	// from_sandbox: replies of connections the policy let through pass;
	// IPv6 never leaves (the sandbox has it disabled; this catches any
	// attempt anyway); sandbox to sandbox through the gateway is refused
	// (on the bridge itself, ports are isolated); then the dispatch chain
	// sends each source address to its sandbox's chain. An address not in
	// the map (spoofed, or a sandbox being torn down) is dropped.
	rule(ch.from, cat(ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	rule(ch.from, cat(matchNFProto(unix.NFPROTO_IPV6), verdict(expr.VerdictDrop))...)
	rule(ch.from, cat(matchIfname(expr.MetaKeyOIFNAME, f.bridge), verdict(expr.VerdictDrop))...)
	// Past the IPv6 rule only IPv4 is left (the inet hooks see nothing
	// else), so the IPv4 header offsets below are safe.
	rule(ch.from, jump(chainDispatch)...)
	rule(ch.from, verdict(expr.VerdictDrop)...)

	// to_sandbox: nothing opens a connection into a sandbox; only replies
	// to the sandbox's own connections get in.
	rule(ch.to, cat(ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	rule(ch.to, verdict(expr.VerdictDrop)...)
}

// hostRules adds the rules between sandboxes and the host: what a sandbox
// may reach of the host (DNS, the credential proxy), that the host opens
// nothing into a sandbox, and the masquerade out of the uplink.
func (f *firewall) hostRules(rule func(*nftables.Chain, ...expr.Any), ch tableChains, gw netip.Addr, subnet netip.Prefix, uplink string, credPort int) {
	// sandbox_to_host: the host's own addresses (all of them, the
	// gateway's included) are closed to sandboxes, except DNS to the
	// gateway, where the forwarder enforces the policy.
	rule(ch.toHost, cat(ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	rule(ch.toHost, cat(matchNFProto(unix.NFPROTO_IPV6), verdict(expr.VerdictDrop))...)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(ch.toHost, cat(matchNFProto(unix.NFPROTO_IPV4), matchAddr(16, gw), matchL4Proto(proto), matchDport(53), verdict(expr.VerdictAccept))...)
	}
	// The credential proxy (credentials.go), which decides per request
	// whose it is; only when credentials are configured.
	if credPort > 0 {
		rule(ch.toHost, cat(matchNFProto(unix.NFPROTO_IPV4), matchAddr(16, gw), matchL4Proto(unix.IPPROTO_TCP), matchDport(uint16(credPort)), verdict(expr.VerdictAccept))...)
	}
	rule(ch.toHost, verdict(expr.VerdictDrop)...)

	// output: the host opens no connection into a sandbox either.
	rule(ch.out, cat(matchIfname(expr.MetaKeyOIFNAME, f.bridge), ctStateIn(expr.CtStateBitNEW), verdict(expr.VerdictDrop))...)

	// Masquerade the subnet out of the default-route interface only.
	rule(ch.post, cat(matchNFProto(unix.NFPROTO_IPV4), matchPrefix(12, subnet), matchIfname(expr.MetaKeyOIFNAME, uplink), []expr.Any{&expr.Masq{}})...)
}

// sandboxKey names a sandbox's objects in the table and its host veth:
// sandbox ids may be longer than interface names allow.
func sandboxKey(id string) string { return shortHash(id) }

// sandboxRules is what setSandbox installs for one sandbox.
type sandboxRules struct {
	key    string
	ip     netip.Addr
	rules  *rules
	limits Limits
}

// setSandbox creates or replaces a sandbox's chain, sets and counters, in
// one transaction: a running sandbox changes policy without a moment of
// either policy missing. The counters and the allowed DNS addresses
// survive a replacement.
func (f *firewall) setSandbox(s sandboxRules) error {
	c, err := f.conn()
	if err != nil {
		return err
	}
	t := f.table
	chain := &nftables.Chain{Name: prefixSandboxChain + s.key, Table: t}
	existing, err := c.ListChain(t, chain.Name)
	fresh := err != nil || existing == nil

	allowDNS := &nftables.Set{Table: t, Name: prefixAllowDNS + s.key, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	allowNet := &nftables.Set{Table: t, Name: prefixAllowNet + s.key, KeyType: nftables.TypeIPAddr, Interval: true}
	denied := &nftables.Set{Table: t, Name: prefixDenied + s.key, KeyType: nftables.TypeIPAddr,
		HasTimeout: true, Timeout: deniedTimeout, Dynamic: true, Size: deniedSetSize}
	if fresh {
		c.AddChain(chain)
		for _, set := range []*nftables.Set{allowDNS, allowNet, denied} {
			if err := c.AddSet(set, nil); err != nil {
				return err
			}
		}
		for _, n := range []string{prefixAllowedCtr + s.key, prefixDeniedCtr + s.key} {
			c.AddObj(&nftables.NamedObj{Table: t, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
		}
	} else {
		c.FlushChain(chain)
		c.FlushSet(allowNet)
	}
	if len(s.rules.prefixes) > 0 {
		if err := c.SetAddElements(allowNet, intervalElements(s.rules.prefixes)); err != nil {
			return err
		}
	}

	rule := func(exprs ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs}) }
	deniedCtr := &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: prefixDeniedCtr + s.key}
	allowedCtr := &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: prefixAllowedCtr + s.key}
	// The chain sees first packets of flows only (from_sandbox accepted
	// established ones), so its counters count connection attempts.
	if s.limits.ConnPerSecond > 0 {
		rule(&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(s.limits.ConnPerSecond), Over: true,
			Unit: expr.LimitTimeSecond, Burst: s.limits.ConnPerSecond}, deniedCtr, &expr.Verdict{Kind: expr.VerdictDrop})
	}
	// network.deny beats every allow.
	rule(cat([]expr.Any{loadAddr(16), &expr.Lookup{SourceRegister: 1, SetName: setDeny},
		&expr.Dynset{SrcRegKey: 1, SetName: denied.Name, Operation: unix.NFT_DYNSET_OP_ADD},
		deniedCtr}, verdict(expr.VerdictDrop))...)
	switch s.rules.mode {
	case ModeEgress:
		rule(allowedCtr, &expr.Verdict{Kind: expr.VerdictAccept})
	case ModeAllowlist:
		rule(cat([]expr.Any{loadAddr(16), &expr.Lookup{SourceRegister: 1, SetName: allowDNS.Name}, allowedCtr}, verdict(expr.VerdictAccept))...)
		rule(cat([]expr.Any{loadAddr(16), &expr.Lookup{SourceRegister: 1, SetName: allowNet.Name}, allowedCtr}, verdict(expr.VerdictAccept))...)
	}
	rule(cat([]expr.Any{loadAddr(16), &expr.Dynset{SrcRegKey: 1, SetName: denied.Name, Operation: unix.NFT_DYNSET_OP_ADD},
		deniedCtr}, verdict(expr.VerdictDrop))...)

	// The dispatch rule, once: a replacement keeps the one there.
	dispatch := &nftables.Chain{Name: chainDispatch, Table: t}
	if h, err := f.dispatchRule(c, chain.Name); err != nil {
		return err
	} else if h == nil {
		c.AddRule(&nftables.Rule{Table: t, Chain: dispatch, Exprs: cat(matchAddr(12, s.ip), jump(chain.Name))})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: rules of sandbox %s: %w", s.key, err)
	}
	return nil
}

// removeSandbox deletes a sandbox's map entry, chain, sets and counters.
// Idempotent: what is already gone is skipped.
func (f *firewall) removeSandbox(key string) error {
	if ok, err := f.exists(); err != nil || !ok {
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	t := f.table
	// The dispatch rule first, in its own transaction: once it is gone no
	// packet jumps to the chain, and the chain can be deleted.
	chainName := prefixSandboxChain + key
	r, err := f.dispatchRule(c, chainName)
	if err != nil {
		return err
	}
	if r != nil {
		if err := c.DelRule(r); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("nftables: unmap sandbox %s: %w", key, err)
		}
	}
	if ch, err := c.ListChain(t, chainName); err == nil && ch != nil {
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return err
	}
	for _, s := range sets {
		if s.Name == prefixAllowDNS+key || s.Name == prefixAllowNet+key || s.Name == prefixDenied+key {
			c.DelSet(s)
		}
	}
	objs, err := c.GetNamedObjects(t)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if no, ok := o.(*nftables.NamedObj); ok && (no.Name == prefixAllowedCtr+key || no.Name == prefixDeniedCtr+key) {
			c.DeleteObject(no)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: remove sandbox %s: %w", key, err)
	}
	return nil
}

// dispatchRule finds the rule of the dispatch chain that jumps to chain.
func (f *firewall) dispatchRule(c *nftables.Conn, chain string) (*nftables.Rule, error) {
	rules, err := c.GetRules(f.table, &nftables.Chain{Name: chainDispatch, Table: f.table})
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s: %w", chainDispatch, err)
	}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictJump && v.Chain == chain {
				return r, nil
			}
		}
	}
	return nil, nil
}

// sandboxKeys lists the keys of sandboxes that have a chain in the table.
func (f *firewall) sandboxKeys() ([]string, error) {
	if ok, err := f.exists(); err != nil || !ok {
		return nil, err
	}
	c, err := f.conn()
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, ch := range chains {
		if ch.Table.Name == f.table.Name && strings.HasPrefix(ch.Name, prefixSandboxChain) {
			keys = append(keys, strings.TrimPrefix(ch.Name, prefixSandboxChain))
		}
	}
	return keys, nil
}

// allowAddrs adds addresses an allowed name resolved to, each for its TTL
// (clamped to [minDNSTimeout, maxDNSTimeout]). An address already in the
// set gets the longer of its remaining time and the new one.
func (f *firewall) allowAddrs(key string, addrs map[netip.Addr]time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	set := &nftables.Set{Table: f.table, Name: prefixAllowDNS + key, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	current, err := c.GetSetElements(set)
	if err != nil {
		return fmt.Errorf("nftables: read %s: %w", set.Name, err)
	}
	left := map[netip.Addr]time.Duration{}
	for _, e := range current {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			left[a] = e.Expires
		}
	}
	var add, del []nftables.SetElement
	for a, ttl := range addrs {
		d := min(max(ttl, minDNSTimeout), maxDNSTimeout)
		if l, ok := left[a]; ok {
			if l >= d {
				continue
			}
			// An element's timeout cannot be changed in place: delete and
			// add it again in the same transaction, so it is never absent.
			del = append(del, nftables.SetElement{Key: a.AsSlice()})
		}
		add = append(add, nftables.SetElement{Key: a.AsSlice(), Timeout: d})
	}
	if len(del) > 0 {
		if err := c.SetDeleteElements(set, del); err != nil {
			return err
		}
	}
	if len(add) > 0 {
		if err := c.SetAddElements(set, add); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		if len(del) == 0 {
			return fmt.Errorf("nftables: allow addresses for %s: %w", key, err)
		}
		// An element expired between the read and the delete: retry
		// with additions only.
		c2, cerr := f.conn()
		if cerr != nil {
			return cerr
		}
		if err := c2.SetAddElements(set, add); err != nil {
			return err
		}
		if err := c2.Flush(); err != nil {
			return fmt.Errorf("nftables: allow addresses for %s: %w", key, err)
		}
	}
	return nil
}

// Counters are a sandbox's connection-attempt counters.
type Counters struct {
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	// DeniedDestinations are the most recent denied destination addresses
	// and refused DNS names, at most deniedSetSize addresses plus
	// maxDeniedNames names.
	DeniedDestinations []string `json:"denied_destinations"`
}

// counters reads a sandbox's counters and denied destination addresses.
func (f *firewall) counters(key string) (Counters, error) {
	var out Counters
	c, err := f.conn()
	if err != nil {
		return out, err
	}
	for _, n := range []string{prefixAllowedCtr + key, prefixDeniedCtr + key} {
		o, err := c.GetObject(&nftables.NamedObj{Table: f.table, Name: n, Type: nftables.ObjTypeCounter})
		if err != nil {
			return out, fmt.Errorf("nftables: counter %s: %w", n, err)
		}
		var pk uint64
		switch v := o.(type) {
		case *nftables.NamedObj:
			if ctr, ok := v.Obj.(*expr.Counter); ok {
				pk = ctr.Packets
			}
		case *nftables.CounterObj:
			pk = v.Packets
		}
		if n == prefixAllowedCtr+key {
			out.Allowed = pk
		} else {
			out.Denied = pk
		}
	}
	elems, err := c.GetSetElements(&nftables.Set{Table: f.table, Name: prefixDenied + key, KeyType: nftables.TypeIPAddr})
	if err != nil {
		return out, fmt.Errorf("nftables: denied set of %s: %w", key, err)
	}
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			out.DeniedDestinations = append(out.DeniedDestinations, a.String())
		}
	}
	slices.Sort(out.DeniedDestinations)
	return out, nil
}

// --- expression helpers ---

func cat(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// ifnameBytes is an interface name as nftables compares it: NUL padded to
// IFNAMSIZ.
func ifnameBytes(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func matchIfname(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)},
	}
}

func matchNFProto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func matchL4Proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func matchDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ctStateIn matches packets whose conntrack state has any of bits.
func ctStateIn(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// loadAddr loads the IPv4 address at offset (12 source, 16 destination) of
// the network header into register 1.
func loadAddr(offset uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

func matchAddr(offset uint32, a netip.Addr) []expr.Any {
	return []expr.Any{loadAddr(offset), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()}}
}

func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	return []expr.Any{
		loadAddr(offset),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// intervalElements turns IPv4 prefixes into the elements of an interval
// set: overlapping and adjacent ranges merged first (the kernel refuses
// overlaps), each range as its start and its end+1 marked IntervalEnd.
// IPv6 prefixes are skipped: IPv6 is dropped wholesale.
func intervalElements(prefixes []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi uint64 } // hi exclusive; uint64 so 2^32 fits
	var spans []span
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		lo := uint64(binary.BigEndian.Uint32(p.Addr().AsSlice()))
		spans = append(spans, span{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(spans, func(a, b span) int { return int(a.lo) - int(b.lo) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	var out []nftables.SetElement
	for _, s := range merged {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(s.lo))})
		if s.hi <= 0xffffffff {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(s.hi)), IntervalEnd: true})
		}
	}
	return out
}
