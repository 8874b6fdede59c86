package network

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
)

// Several daemons may share a host (a developer's `make run` beside the
// system daemon), each with its own state. What they make in the host
// namespace is then told apart in two ways:
//
//   - Names from the configuration: the bridge (network.bridge), the
//     address range (network.subnet) and the nftables table named after
//     the bridge (TableName). A live daemon claims its bridge and range
//     (pkg/hostclaim) while New runs, so a second one naming either is
//     refused at start, naming the holder.
//   - Marks on the objects: the bridge's and each host veth's alias, and
//     the comment of the rule in the table's "owner" chain, are hostclaim.Mark of the daemon
//     (its state directory). Marks outlive the daemon, as its sandboxes
//     do: gc and reconcile remove only objects marked as ours (or, made
//     by a daemon older than the marks, unmarked on our bridge), and a
//     daemon whose bridge or table carries another's mark does not start.
//
// Host veths keep one prefix for every daemon (VethPrefix): the name has
// no room for more (IFNAMSIZ), and its hash of a sandbox id is as unique
// as the ids.

// ownLink makes sure an existing link is ours: marked with mark, or
// unmarked (made by a daemon older than the marks: adopted and marked).
// Any other alias is someone else's.
func ownLink(h *netlink.Handle, l netlink.Link, mark string) error {
	switch alias := l.Attrs().Alias; alias {
	case mark:
		return nil
	case "":
		if err := h.LinkSetAlias(l, mark); err != nil {
			return fmt.Errorf("mark %s: %w", l.Attrs().Name, err)
		}
		return nil
	default:
		return &hostclaim.MarkedError{Setting: "network.bridge", Object: "bridge " + l.Attrs().Name, Mark: alias}
	}
}

// claimNames claims the bridge and the address range in the host
// namespace for the manager's life (hostclaim: a second daemon naming
// either is refused while this one lives), then checks that what exists
// of the host side already is ours.
func (m *Manager) claimNames() error {
	err := InNetNS(m.hostNS, func() error {
		br, err := hostclaim.Name("bridge/"+m.cfg.Bridge, "network.bridge", m.cfg.Bridge)
		if err != nil {
			return err
		}
		sn, err := hostclaim.Name("subnet/"+m.cfg.Subnet.String(), "network.subnet", m.cfg.Subnet.String())
		if err != nil {
			return errors.Join(err, br.Release())
		}
		m.claims = []*hostclaim.Claim{br, sn}
		return nil
	})
	if err != nil {
		return err
	}
	mark, exists, err := m.fw.owner()
	if err != nil {
		return err
	}
	if exists && mark != "" && mark != m.mark {
		return &hostclaim.MarkedError{Setting: "network.bridge", Object: "nftables table inet " + m.fw.table.Name, Mark: mark}
	}
	if br, err := m.host.LinkByName(m.cfg.Bridge); err == nil {
		if a := br.Attrs().Alias; a != "" && a != m.mark {
			return &hostclaim.MarkedError{Setting: "network.bridge", Object: "bridge " + m.cfg.Bridge, Mark: a}
		}
	}
	return nil
}

// releaseClaims gives the names up (Close).
func (m *Manager) releaseClaims() {
	for _, c := range m.claims {
		_ = c.Release()
	}
	m.claims = nil
}

// ownedVeth reports whether l is a host veth of ours: marked as ours, or
// unmarked on our bridge (brIndex, -1 if there is none) — one a daemon
// older than the marks made, or one a crash left before it was marked.
// A veth of another daemon (its mark, or on another bridge) is never ours.
func ownedVeth(l netlink.Link, mark string, brIndex int) bool {
	a := l.Attrs()
	if l.Type() != "veth" || !strings.HasPrefix(a.Name, VethPrefix) {
		return false
	}
	if a.Alias != "" {
		return a.Alias == mark
	}
	return brIndex > 0 && a.MasterIndex == brIndex
}

// otherDaemonBridge names a bridge of another daemon in the namespace
// ("" if none): ip_forward stays on while one is there.
func (m *Manager) otherDaemonBridge() string {
	links, err := m.host.LinkList()
	if err != nil {
		return ""
	}
	for _, l := range links {
		if a := l.Attrs().Alias; l.Type() == "bridge" && strings.HasPrefix(a, hostclaim.MarkPrefix) && a != m.mark {
			return l.Attrs().Name
		}
	}
	return ""
}
