package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// What follows is the gateway's routing and placement for the front ends
// that cannot be proxied by path — MCP, whose tool calls carry sandbox ids
// in a JSON-RPC body and whose session spans calls — and that the gateway
// therefore serves over an engine calling the nodes' REST API
// (pkg/gateway/remote): the same placement, the same id routing, the same
// merged list and the same credentials as the proxied REST routes, not a
// copy of them.

// NodeOf is the node that holds sandbox id, by the tag its id carries.
func (g *Gateway) NodeOf(ctx context.Context, id string) (Node, error) {
	if err := sandbox.CheckID(id); err != nil {
		return Node{}, err
	}
	tag, ok := sandbox.IDNodeTag(id)
	if !ok {
		return Node{}, errdefs.NotFoundf("sandbox_id: %q names no node of this fleet", id)
	}
	nodes, err := g.opt.Discovery.Nodes(ctx)
	if err != nil {
		return Node{}, errdefs.Unavailablef("node discovery: %v", err)
	}
	for _, n := range nodes {
		if sandbox.NodeTag(n.Name) == tag {
			return n, nil
		}
	}
	return Node{}, errdefs.NotFoundf("sandbox_id: %q names no node of this fleet", id)
}

// Nodes are the fleet's nodes as discovery lists them.
func (g *Gateway) Nodes(ctx context.Context) ([]Node, error) {
	nodes, err := g.opt.Discovery.Nodes(ctx)
	if err != nil {
		return nil, errdefs.Unavailablef("node discovery: %v", err)
	}
	return nodes, nil
}

// Place picks the node for a create whose JSON request is body, among the
// nodes not in tried, exactly as the REST create is placed (and counted
// into the same view); more says whether another node would have taken
// it, so that a node refusing it (draining, gone) can be tried no more.
func (g *Gateway) Place(ctx context.Context, body []byte, tried map[string]bool) (n Node, more bool, err error) {
	var h placeHints
	_ = json.Unmarshal(body, &h) // the node refuses a malformed request, naming the field
	return g.placeCounted(ctx, h, tried)
}

// Invalidate makes the next placement ask the nodes again (after a node
// refused a create the view had placed there).
func (g *Gateway) Invalidate() { g.invalidate() }

type asGatewayKey struct{}

// AsGateway marks ctx for the gateway's own calls to the nodes, which act
// as the administrator (the end of an MCP session terminating what it
// created): NodeTransport refuses a request whose context names neither a
// principal nor this, so that no caller's request goes out as the gateway
// by omission.
func AsGateway(ctx context.Context) context.Context {
	return context.WithValue(ctx, asGatewayKey{}, true)
}

// NodeTransport carries requests to the nodes over the gateway's pooled
// connections with the gateway's credentials in place of any the request
// had: the gateway secret and the principal its context carries
// (principal.From), as the proxied REST routes do.
func (g *Gateway) NodeTransport() http.RoundTripper { return nodeTransport{g} }

type nodeTransport struct{ g *Gateway }

func (t nodeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var p *principal.Principal
	if pr, ok := principal.From(req.Context()); ok {
		p = &pr
	} else if own, _ := req.Context().Value(asGatewayKey{}).(bool); !own {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errdefs.New(errdefs.Internal, "%s %s: a call to a node names no caller", req.Method, req.URL.Path)
	}
	out := req.Clone(req.Context())
	t.g.authorize(out.Header, p)
	return t.g.opt.Transport.RoundTrip(out)
}

// ListSandboxes merges every node's GET /v1/sandboxes?query as p sees
// them; the sandboxes of a node that does not answer are those p's view
// last saw there, as unavailable (see list).
func (g *Gateway) ListSandboxes(ctx context.Context, p principal.Principal, query string) (*apitypes.SandboxList, error) {
	nodes, err := g.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	view := p.Tenant
	if p.Admin {
		view = "\x00admin"
	}
	lists := make([]apitypes.SandboxList, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.call(ctx, n, http.MethodGet, "/v1/sandboxes?"+query, nil, &p, &lists[i])
		}()
	}
	wg.Wait()
	out := &apitypes.SandboxList{Sandboxes: []apitypes.Sandbox{}}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, n := range nodes {
		if errs[i] != nil {
			var c *errdefs.Error
			if errors.As(errs[i], &c) {
				// An answer that is an error of the request (a bad
				// state filter) is the caller's, not the node's loss.
				return nil, errs[i]
			}
			g.log.Warn("node does not answer a list", "node", n.Name, "err", errs[i])
			for _, sb := range g.seen[n.Name][view] {
				sb.State = apitypes.StateUnavailable
				out.Sandboxes = append(out.Sandboxes, sb)
			}
			continue
		}
		if g.seen[n.Name] == nil {
			g.seen[n.Name] = map[string][]apitypes.Sandbox{}
		}
		var live []apitypes.Sandbox
		for _, sb := range lists[i].Sandboxes {
			if sb.State.Live() {
				live = append(live, sb)
			}
		}
		g.seen[n.Name][view] = live
		out.Sandboxes = append(out.Sandboxes, lists[i].Sandboxes...)
		out.Truncated = out.Truncated || lists[i].Truncated
	}
	sort.SliceStable(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].CreatedAt.Before(out.Sandboxes[j].CreatedAt) })
	out.Total = len(out.Sandboxes)
	return out, nil
}

// list is GET /v1/sandboxes: ListSandboxes of the caller.
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, p principal.Principal) {
	l, err := g.ListSandboxes(r.Context(), p, r.URL.RawQuery)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

// serveMCP serves /mcp with opt.MCP's handler for caller p: the MCP
// server over the nodes (pkg/gateway/remote), its tool calls made as p.
func (g *Gateway) serveMCP(w http.ResponseWriter, r *http.Request, p principal.Principal) {
	if g.mcp == nil {
		writeError(w, errdefs.Unavailablef("%s: MCP is not configured on this gateway", r.URL.Path))
		return
	}
	if r.ContentLength > g.opt.MaxBodyBytes {
		writeError(w, errdefs.Invalidf("body: %d bytes is larger than server.max_request_bytes (%d bytes)", r.ContentLength, g.opt.MaxBodyBytes))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, g.opt.MaxBodyBytes)
	ctx := principal.WithOrigin(principal.With(r.Context(), p), principal.Origin{FrontEnd: "mcp", Source: r.RemoteAddr})
	g.mcp.ServeHTTP(w, r.WithContext(ctx))
}

// StateQuery is a list's state filter as its query string.
func StateQuery(state string) string {
	if state == "" {
		return ""
	}
	return url.Values{"state": {state}}.Encode()
}

// Admission is a create's hold on its caller's fleet quota, taken by the
// MCP engine exactly as the REST create takes it (reserve before placing,
// fleet.go): Bind it to the sandbox the node made, or Release it.
type Admission struct {
	g   *Gateway
	rsv *reservation // nil: nothing counted (no fleet store, or no key)
}

// Admit reserves, for the caller on ctx, one sandbox of the create whose
// JSON request is body against its key's fleet quota; it refuses
// (limit_exceeded) when the fleet has no room left for the key.
func (g *Gateway) Admit(ctx context.Context, body []byte) (*Admission, error) {
	p, _ := principal.From(ctx)
	var h placeHints
	_ = json.Unmarshal(body, &h) // the node refuses a malformed request, naming the field
	rsv, err := g.reserve(ctx, p, h)
	if err != nil {
		return nil, err
	}
	return &Admission{g: g, rsv: rsv}, nil
}

// Bind counts the admission as sandbox id on node (released when it is
// terminated through a gateway or found gone by a reconciliation).
func (a *Admission) Bind(id, node string) {
	if a == nil || a.rsv == nil || a.rsv.done {
		return
	}
	// Not the caller's context: the node made the sandbox, it counts.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.g.bind(ctx, a.rsv, id, node); err != nil {
		a.g.log.Warn("bind a reservation to its sandbox", "sandbox", id, "err", err)
	}
}

// Release releases an admission not bound (the create failed, or it was
// a run whose sandbox ended with it); a bound one is left counted.
func (a *Admission) Release() {
	if a != nil {
		a.g.settle(a.rsv)
	}
}

// Released releases the fleet count of sandbox id after its terminate
// through this gateway answered.
func (g *Gateway) Released(id string) { g.released(id) }
