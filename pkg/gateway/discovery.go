// Package gateway is `mcp-sandboxd gateway`: the stateless front of a fleet
// of node daemons. It authenticates callers against the fleet's tenants,
// places each create on a node with room, and routes every later request by
// the node tag its sandbox id carries (pkg/sandbox.NodeTag) to the node that
// holds it, reverse-proxying at the HTTP layer so that the node's own front
// end (REST, streams, terminal WebSockets) answers: no handler logic lives
// twice. Lists merge every node's. See docs/ARCHITECTURE.md, "Gateway".
package gateway

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Node is one node daemon as discovery knows it.
type Node struct {
	// Name is the node's node.name: the source of the tag in its
	// sandboxes' ids.
	Name string
	// URL is the node daemon's HTTP listener (http://host:port).
	URL string
	// Ready is discovery's view (a Kubernetes pod's readiness); a static
	// list says true and the gateway's probe of GET /v1/node decides.
	Ready bool
	// Draining is discovery's view (a cordoned Kubernetes node, a pod
	// being deleted); the node's own drain flag counts too.
	Draining bool
	// Capacity is the node's last reported capacity and usage, nil when
	// discovery does not know it (the gateway asks the node).
	Capacity *apitypes.NodeStatus
}

// Discovery lists the fleet's nodes. The static list (config
// gateway.nodes) and the Kubernetes discovery (pkg/kubediscovery) implement
// it; an error means the list is unknown, not empty.
type Discovery interface {
	Nodes(ctx context.Context) ([]Node, error)
}

// Static is the node list of gateway.nodes, for hosts without Kubernetes.
type Static []config.GatewayNode

// Nodes returns the configured nodes, all Ready: whether one answers is
// the gateway's probe's to find out.
func (s Static) Nodes(context.Context) ([]Node, error) {
	out := make([]Node, 0, len(s))
	for _, n := range s {
		out = append(out, Node{Name: n.Name, URL: n.URL, Ready: true})
	}
	return out, nil
}

// CheckTags refuses a node list in which two names share a tag
// (pkg/sandbox.NodeTag): their sandboxes' ids could not be told apart. With
// 32-bit tags this takes tens of thousands of nodes to happen by chance.
func CheckTags(nodes []Node) error { return checkTags(nodes, sandbox.NodeTag) }

// checkTags is CheckTags with the tag function a test may shorten.
func checkTags(nodes []Node, tagOf func(string) string) error {
	seen := map[string]string{}
	for _, n := range nodes {
		tag := tagOf(n.Name)
		if other, ok := seen[tag]; ok && other != n.Name {
			return errdefs.Invalidf("gateway.nodes: %q and %q share the id tag %s; rename one", other, n.Name, tag)
		}
		seen[tag] = n.Name
	}
	return nil
}
