// Package network gives sandboxes their network: a bridge with the gateway
// address on the daemon's side, a network namespace per sandbox joined by a
// veth pair, an IPv4 address leased in SQLite, one nftables table of the
// daemon's own for NAT and policy, a DNS forwarder on the gateway that
// enforces allowlists, and qdiscs for bandwidth limits.
//
// Everything is done through netlink (github.com/vishvananda/netlink) and
// nf_tables (github.com/google/nftables); no ip, iptables, nft or tc process
// is ever started. Every operation on the host side takes the network
// namespace it applies to (the daemon's own in production), so tests build
// the host side inside namespaces they create and never touch the machine's.
//
// # Security boundary
//
// A sandbox is untrusted. What it can reach is decided only here, by the
// rules of the nftables table (firewall.go) and by the DNS forwarder
// (dns.go); see the comments there for each rule's reason. In short: nothing
// connects into a sandbox, a sandbox never reaches another sandbox, the
// host's own addresses, or network.deny; IPv6 is disabled in the sandbox and
// dropped on the host side; an allowlist sandbox reaches only the addresses
// its allowed names resolved to (for their TTL) and its allowed CIDRs.
package network
