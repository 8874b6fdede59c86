package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// FleetStore is what the gateway needs of the fleet's shared database
// (pkg/store/pgstore): the per-sandbox quota accounting and the audit rows.
// Accounting (docs/ARCHITECTURE.md, "Gateway"):
//
//   - a create through any gateway reserves one sandbox of its limits
//     against its key's quota before it is placed (ReserveSandbox: one
//     conditional UPDATE, so gateways never admit more than the quota
//     together), binds the reservation to the sandbox and its node once
//     the node answered, and releases it when the create failed;
//   - a sandbox ends on its node (a terminate, its TTL, idle expiry, gc),
//     which tells no gateway: a terminate a gateway forwarded releases at
//     once, and every gateway reconciles each node that answers its list
//     against the rows bound there (ReconcileNode), releasing what ended;
//   - a node that does not answer is not reconciled: its sandboxes stay
//     counted while it is down (they survive it and come back with it); a
//     node gone for good is released by an operator (ReleaseNode).
type FleetStore interface {
	ReserveSandbox(ctx context.Context, keyID string, add apitypes.KeyUse, q apitypes.Quota) (string, error)
	BindSandbox(ctx context.Context, reservation, sandboxID, node string) error
	ReleaseReservation(ctx context.Context, reservation string) error
	ReleaseSandbox(ctx context.Context, id string) error
	Now(ctx context.Context) (time.Time, error)
	ReconcileNode(ctx context.Context, node string, since time.Time, live []string) (int, error)
	ReleaseStale(ctx context.Context, age time.Duration) (int, error)
	ReleaseNode(ctx context.Context, node string) (int, error)
	UseLogin(ctx context.Context, nonce string, expires time.Time) (bool, error)
	Usage(ctx context.Context, keyID string) (apitypes.KeyUse, error)
	AppendAudit(ctx context.Context, rec audit.Record) (audit.Record, error)
	VerifyAudit(ctx context.Context) (*apitypes.AuditReport, error)
}

// KeyLookup finds a key's quota (pkg/tenants' Service).
type KeyLookup interface {
	Key(id string) (apitypes.Key, bool)
}

// staleReservation is how old a reservation never bound to a sandbox may
// grow before a reconciliation releases it: its gateway stopped between
// reserving and the node's answer. Longer than any create takes (an image
// built on first use included).
const staleReservation = 15 * time.Minute

// reservation is a create's hold on its key's fleet quota.
type reservation struct {
	id    string
	bound bool
	done  bool // released
}

// reserve reserves one sandbox of the create's limits (the node's default
// for a limit it does not name) for p's key; nil when there is no fleet
// store or no key (the gateway's own calls).
func (g *Gateway) reserve(ctx context.Context, p principal.Principal, h placeHints) (*reservation, error) {
	if g.opt.Fleet == nil || p.KeyID == "" {
		return nil, nil
	}
	var q apitypes.Quota
	if g.opt.Keys != nil {
		if k, ok := g.opt.Keys.Key(p.KeyID); ok {
			q = k.Quota
		}
	}
	def := g.defaults(ctx)
	add := apitypes.KeyUse{Sandboxes: 1, MemoryMB: def.MemoryBytes >> 20, CPUs: def.CPUs, DiskMB: def.DiskBytes >> 20}
	if h.MemoryMB != nil {
		add.MemoryMB = max(*h.MemoryMB, 0)
	}
	if h.CPUs != nil {
		add.CPUs = max(*h.CPUs, 0)
	}
	if h.DiskMB != nil {
		add.DiskMB = max(*h.DiskMB, 0)
	}
	id, err := g.opt.Fleet.ReserveSandbox(ctx, p.KeyID, add, q)
	if err != nil {
		return nil, err
	}
	return &reservation{id: id}, nil
}

// settle releases a reservation its create did not bind (the create
// failed, or was a run whose sandbox ended with it).
func (g *Gateway) settle(res *reservation) {
	if res == nil || res.bound || res.done {
		return
	}
	res.done = true
	// Not the request's context: the caller may have gone, the release
	// must not.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.opt.Fleet.ReleaseReservation(ctx, res.id); err != nil {
		g.log.Warn("release a reservation; a reconciliation releases it when stale", "reservation", res.id, "err", err)
	}
}

// bindCreated binds res to the sandbox a node's create answer names; the
// body is read and put back for the caller.
func (g *Gateway) bindCreated(res *http.Response, rsv *reservation, node string) error {
	body, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	res.Body.Close()
	if err != nil {
		return err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	var sb struct {
		ID        string `json:"sandbox_id"`
		SandboxID string `json:"sandboxID"` // an E2B create's answer
	}
	if json.Unmarshal(body, &sb) != nil {
		return nil // not a sandbox: the reservation is released
	}
	if id, ok := fromE2B(sb.SandboxID); ok && sb.ID == "" {
		sb.ID = id
	}
	if sb.ID == "" {
		return nil
	}
	audit.CallFrom(res.Request.Context()).SetTarget(sb.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = g.bind(ctx, rsv, sb.ID, node)
	// What the gateway adds after the node answered, beside
	// gateway-place (before it saw the create).
	res.Header.Add("Server-Timing", fmt.Sprintf("gateway-bind;dur=%.3f", float64(time.Since(start).Microseconds())/1000))
	if err != nil {
		// The node made the sandbox: answer it. A sandbox already bound
		// (a retried create with its request_id) is counted by its first
		// reservation, and this one is released.
		g.log.Warn("bind a reservation to its sandbox", "sandbox", sb.ID, "err", err)
		return nil
	}
	return nil
}

// bind counts reservation rsv as sandbox id on node from now on.
func (g *Gateway) bind(ctx context.Context, rsv *reservation, id, node string) error {
	if err := g.opt.Fleet.BindSandbox(ctx, rsv.id, id, node); err != nil {
		return err
	}
	rsv.bound = true
	return nil
}

// released releases sandbox id after its terminate answered 200.
func (g *Gateway) released(id string) {
	if g.opt.Fleet == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.opt.Fleet.ReleaseSandbox(ctx, id); err != nil {
		g.log.Warn("release a terminated sandbox; the next reconciliation releases it", "sandbox", id, "err", err)
	}
}

// Reconcile releases, every ReconcileInterval until ctx ends, the fleet
// reservations of sandboxes that ended on their nodes (see FleetStore);
// without a fleet store it returns at once.
func (g *Gateway) Reconcile(ctx context.Context) {
	if g.opt.Fleet == nil {
		return
	}
	t := time.NewTicker(g.opt.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.ReconcileOnce(ctx)
	}
}

// ReconcileOnce is one pass of Reconcile: each node that answers its list
// of live sandboxes in full has the reservations bound there before the
// list released unless the list holds them.
func (g *Gateway) ReconcileOnce(ctx context.Context) {
	nodes, err := g.opt.Discovery.Nodes(ctx)
	if err != nil {
		return
	}
	since, err := g.opt.Fleet.Now(ctx)
	if err != nil {
		g.log.Warn("reconcile: the fleet's database does not answer", "err", err)
		return
	}
	for _, n := range nodes {
		var l apitypes.SandboxList
		if err := g.call(ctx, n, http.MethodGet, "/v1/sandboxes", nil, nil, &l); err != nil || l.Truncated {
			continue // not known: nothing released
		}
		live := []string{}
		for _, sb := range l.Sandboxes {
			if sb.State.Live() {
				live = append(live, sb.ID)
			}
		}
		if k, err := g.opt.Fleet.ReconcileNode(ctx, n.Name, since, live); err != nil {
			g.log.Warn("reconcile a node's reservations", "node", n.Name, "err", err)
		} else if k > 0 {
			g.log.Info("released the reservations of sandboxes that ended", "node", n.Name, "released", k)
		}
	}
	if k, err := g.opt.Fleet.ReleaseStale(ctx, staleReservation); err == nil && k > 0 {
		g.log.Info("released stale reservations", "released", k)
	}
}

// releaseNode is DELETE /v1/nodes/{name}/quota-counts (admin): the
// operator's release of the fleet quota counts of a node gone for good
// with its sandboxes. A node that still answers is refused: its sandboxes
// live, and reconciliation keeps its counts right.
func (g *Gateway) releaseNode(w http.ResponseWriter, r *http.Request, name string) {
	if g.opt.Fleet == nil {
		writeError(w, errdefs.Unavailablef("quota counts: this gateway has no fleet database (store.postgres_url)"))
		return
	}
	if name == "" || len(name) > 63 || strings.ContainsAny(name, "/ ") {
		writeError(w, errdefs.Invalidf("node: %q is not a node name", name))
		return
	}
	if nodes, err := g.opt.Discovery.Nodes(r.Context()); err == nil {
		for _, n := range nodes {
			var st apitypes.NodeStatus
			if n.Name == name && g.call(r.Context(), n, http.MethodGet, "/v1/node", nil, nil, &st) == nil {
				writeError(w, errdefs.Conflictf("node: %s answers; its sandboxes are live and reconciled, not released", name))
				return
			}
		}
	}
	k, err := g.opt.Fleet.ReleaseNode(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"node": name, "released": k})
}

// fleetAudit appends the gateway's records to the fleet's audit rows.
type fleetAudit struct{ s FleetStore }

// Append implements audit.Appender: the record is committed before the
// caller's answer leaves, as a daemon's file append is.
func (a fleetAudit) Append(rec audit.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.s.AppendAudit(ctx, rec)
	return err
}

// classify names a gateway request for the audit log: creates, terminates,
// drains, key changes and every other request that changes anything (a
// terminal is a shell), by route and target; authentication failures are
// recorded by the middleware.
func (g *Gateway) classify(r *http.Request) audit.Classification {
	path := r.URL.Path
	k := audit.Classification{Action: r.Method + " " + path}
	switch {
	case strings.HasPrefix(path, "/v1/sandboxes/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(path, "/v1/sandboxes/"), "/")
		k.Target, k.Action = id, r.Method+" /v1/sandboxes/{id}"
		if rest != "" {
			k.Action += "/" + rest
		}
	case strings.HasPrefix(path, "/v1/nodes/"):
		name, rest, _ := strings.Cut(strings.TrimPrefix(path, "/v1/nodes/"), "/")
		k.Target, k.Action = name, r.Method+" /v1/nodes/{name}/"+rest
	case strings.HasPrefix(path, "/v1/keys/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(path, "/v1/keys/"), "/")
		k.Target, k.Action = id, r.Method+" /v1/keys/{id}"
		if rest != "" {
			k.Action += "/" + rest
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		// A terminal is a shell in the sandbox; a login opens a session.
		k.Changes = strings.HasSuffix(path, "/terminal") && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") ||
			path == "/login" && r.URL.Query().Get("token") != ""
		if path == "/login" {
			k.Action = r.Method + " /login" // never the token
		}
	default:
		k.Changes = true
	}
	return k
}

// auditVerify is GET /v1/audit/verify on a gateway: the fleet's audit rows
// checked by pkg/audit's verifier (`sandboxctl --url GATEWAY audit verify`).
func (g *Gateway) auditVerify(w http.ResponseWriter, r *http.Request) {
	if g.opt.Fleet == nil {
		writeError(w, errdefs.Unavailablef("audit: this gateway has no fleet database (store.postgres_url)"))
		return
	}
	rep, err := g.opt.Fleet.VerifyAudit(r.Context())
	if err != nil {
		writeError(w, errdefs.Wrap(errdefs.Internal, err, "audit: verify"))
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// defaults are the limits a create naming none gets: any answering node's
// (a fleet's nodes share their configuration).
func (g *Gateway) defaults(ctx context.Context) apitypes.Limits {
	g.viewMu.Lock()
	empty := g.view == nil
	g.viewMu.Unlock()
	if empty {
		v := g.probe(ctx)
		g.viewMu.Lock()
		if g.view == nil {
			g.view, g.viewAt = v, time.Now()
		}
		g.viewMu.Unlock()
	}
	g.viewMu.Lock()
	defer g.viewMu.Unlock()
	for _, pr := range g.view {
		if pr.err == nil {
			return pr.st.Defaults
		}
	}
	return apitypes.Limits{}
}
