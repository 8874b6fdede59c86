package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// VethPrefix starts the name of every host-side veth the daemon creates;
// gc recognises its own links by it.
const VethPrefix = "sbv"

// sandboxIfname is the sandbox's end of its veth pair.
const sandboxIfname = "eth0"

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:6])
}

// hostVethName is the host end of a sandbox's veth pair: the prefix and 12
// hex digits of the id's hash, 15 characters, the most IFNAMSIZ allows.
func hostVethName(sandboxID string) string { return VethPrefix + shortHash(sandboxID) }

// ensureBridge creates the bridge in the host namespace if missing, marked
// with mark, gives it gw/prefix and brings it up. An existing bridge must
// be ours (ownLink).
func ensureBridge(h *netlink.Handle, name string, gw netip.Prefix, mtu int, mark string) (netlink.Link, error) {
	br, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = name
		if mtu > 0 {
			la.MTU = mtu
		}
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if br, err = h.LinkByName(name); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("%s exists and is a %s, not a bridge", name, br.Type())
	}
	if err := ownLink(h, br, mark); err != nil {
		return nil, err
	}
	addr := &netlink.Addr{IPNet: prefixToIPNet(gw)}
	if err := h.AddrReplace(br, addr); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", gw, name, err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bring up %s: %w", name, err)
	}
	return br, nil
}

// deleteLink removes a link by name; a missing link is not an error.
func deleteLink(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// vethSpec is one sandbox's veth pair.
type vethSpec struct {
	hostName string
	bridge   netlink.Link
	sandbox  netns.NsHandle
	addr     netip.Prefix // the sandbox's address with the subnet's length
	gateway  netip.Addr
	mtu      int
	limits   Limits
	mark     string // hostclaim.Mark of the daemon, the host end's alias
}

// connectVeth creates the pair with its host end on the bridge and its
// other end, eth0, inside the sandbox's namespace, addressed and routed
// through the gateway. IPv6 is switched off inside the sandbox first, so
// no link-local address ever appears on eth0.
func connectVeth(host *netlink.Handle, v vethSpec) error {
	if _, err := writeSysctl(v.sandbox, "net/ipv6/conf/all/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("disable IPv6 in the sandbox: %w", err)
	}
	if _, err := writeSysctl(v.sandbox, "net/ipv6/conf/default/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("disable IPv6 in the sandbox: %w", err)
	}
	la := netlink.NewLinkAttrs()
	la.Name = v.hostName
	la.MasterIndex = v.bridge.Attrs().Index
	if v.mtu > 0 {
		la.MTU = v.mtu
	}
	veth := &netlink.Veth{LinkAttrs: la, PeerName: sandboxIfname, PeerNamespace: netlink.NsFd(v.sandbox)}
	if err := host.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", v.hostName, err)
	}
	hl, err := host.LinkByName(v.hostName)
	if err != nil {
		return err
	}
	// Whose it is, for gc (a crash before this leaves it on our bridge,
	// which says so too).
	if err := host.LinkSetAlias(hl, v.mark); err != nil {
		return fmt.Errorf("mark %s: %w", v.hostName, err)
	}
	// Isolated bridge ports forward only to non-isolated ones (the bridge
	// itself): sandboxes cannot reach each other at layer 2, whatever
	// addresses they use.
	if err := host.LinkSetIsolated(hl, true); err != nil {
		return fmt.Errorf("isolate %s: %w", v.hostName, err)
	}
	if err := host.LinkSetUp(hl); err != nil {
		return fmt.Errorf("bring up %s: %w", v.hostName, err)
	}

	sh, err := netlink.NewHandleAt(v.sandbox)
	if err != nil {
		return fmt.Errorf("netlink in the sandbox namespace: %w", err)
	}
	defer sh.Close()
	sl, err := sh.LinkByName(sandboxIfname)
	if err != nil {
		return err
	}
	if err := sh.AddrAdd(sl, &netlink.Addr{IPNet: prefixToIPNet(v.addr)}); err != nil {
		return fmt.Errorf("address %s on the sandbox's %s: %w", v.addr, sandboxIfname, err)
	}
	if err := sh.LinkSetUp(sl); err != nil {
		return err
	}
	if err := sh.RouteAdd(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: net.IP(v.gateway.AsSlice()), Scope: netlink.SCOPE_UNIVERSE}); err != nil {
		return fmt.Errorf("default route in the sandbox: %w", err)
	}
	// The kernel activates a link's queue when its link watcher sees the
	// carrier, which it does at most once a second: until then packets
	// are dropped, and a sandbox's first connection would lose its SYN
	// and wait a second for the retransmission. Return only once both
	// ends and the bridge carry traffic.
	if err := waitOperUp(host, v.hostName); err != nil {
		return err
	}
	if err := waitOperUp(host, v.bridge.Attrs().Name); err != nil {
		return err
	}
	if err := waitOperUp(sh, sandboxIfname); err != nil {
		return err
	}
	if v.limits.BandwidthBytes > 0 {
		// Shape both directions: the host end's egress is the sandbox's
		// download, the sandbox end's its upload (the sandbox has no
		// CAP_NET_ADMIN to remove it).
		if err := shape(host, hl, v.limits.BandwidthBytes, v.mtu); err != nil {
			return err
		}
		if err := shape(sh, sl, v.limits.BandwidthBytes, v.mtu); err != nil {
			return err
		}
	}
	return nil
}

// waitOperUp waits until a link's operational state is up.
func waitOperUp(h *netlink.Handle, name string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s is still %s after 3s", name, l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// bringUpLoopback sets lo up in a namespace (every sandbox has it, in
// every mode).
func bringUpLoopback(ns netns.NsHandle) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

// shape replaces the root qdisc of link with a token bucket of rate bytes
// per second. The bucket holds 20 ms of traffic but at least 16 KiB, so
// full-size packets always fit; the queue holds 200 ms worth, beyond which
// packets are dropped and TCP backs off (a shorter queue makes TCP back off
// so often that the link stays well below the rate).
func shape(h *netlink.Handle, link netlink.Link, rate uint64, mtu int) error {
	if mtu <= 0 {
		mtu = 1500
	}
	burst := max(uint32(rate/50), uint32(2*mtu), 16<<10)
	limit := max(uint32(rate/5), burst)
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Limit:      limit,
		Buffer:     netlink.Xmittime(rate, burst),
	}
	if err := h.QdiscReplace(q); err != nil {
		return fmt.Errorf("bandwidth limit on %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// defaultRouteLink returns the name of the interface of the IPv4 default
// route in the namespace of h.
func defaultRouteLink(h *netlink.Handle) (string, error) {
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", err
	}
	for _, r := range routes {
		if r.Dst == nil || (r.Dst.IP.IsUnspecified() && maskBits(r.Dst.Mask) == 0) {
			l, err := h.LinkByIndex(r.LinkIndex)
			if err != nil {
				return "", err
			}
			return l.Attrs().Name, nil
		}
	}
	return "", errors.New("no IPv4 default route")
}

func maskBits(m net.IPMask) int { ones, _ := m.Size(); return ones }

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
