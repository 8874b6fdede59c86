package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Options configure New.
type Options struct {
	// Discovery lists the nodes (Static, pkg/kubediscovery).
	Discovery Discovery
	// Auth authenticates callers' bearer keys: the fleet's tenants
	// (pkg/tenants' Service over the store the gateways share).
	Auth api.Authenticator
	// Secret is the gateway secret the nodes trust (node.gateway_secret_file).
	Secret string
	// NodeTimeout bounds a call that asks every node (default 2s).
	NodeTimeout time.Duration
	// Transport reaches the nodes; nil means a pooled http.Transport.
	Transport http.RoundTripper
	// ProbeInterval is how old the nodes' capacity may be before a
	// placement renews it in the background (default 250ms): a create
	// does not wait for every node's answer, and this gateway counts its
	// own placements in between. A drain made through another gateway is
	// seen within about it; a create that still reaches the draining node
	// is placed again elsewhere.
	ProbeInterval time.Duration
	// MaxBodyBytes caps a create's body, which the gateway reads to place
	// it (default api.DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Fleet, set when the tenants store is the fleet's PostgreSQL, counts
	// every create against its key's fleet quota and holds the gateway's
	// audit records (fleet.go); nil: neither.
	Fleet FleetStore
	// Keys finds a key's quota (the tenants service behind Auth).
	Keys KeyLookup
	// KeyAdmin, when set, answers /v1/keys from the gateways' tenants
	// store (keys.go); nil: a node answers them.
	KeyAdmin KeyAdmin
	// ReconcileInterval is how often Reconcile releases the reservations
	// of sandboxes that ended on their nodes (default 10s).
	ReconcileInterval time.Duration
	// Log; nil means slog.Default().
	Log *slog.Logger
	// MCP, if not nil, makes /mcp's handler over this gateway (the MCP
	// server over pkg/gateway/remote's engine, built in cmd/mcp-sandboxd:
	// it needs the gateway, hence a function); nil answers /mcp
	// unavailable.
	MCP func(*Gateway) http.Handler
}

// Gateway is the gateway's HTTP handler.
type Gateway struct {
	opt    Options
	log    *slog.Logger
	proxy  *httputil.ReverseProxy
	client *http.Client
	// handler is serve behind the audit log's recording (when Fleet).
	handler http.Handler

	// logins are the web editor login tokens redeemed here, when there
	// is no fleet database (ui.go).
	logins usedLogins

	// previewURL is this gateway's preview listener as callers reach it
	// (preview.go, SetPreviewURL).
	previewMu  sync.Mutex
	previewURL string

	// seen is, per node and per caller's view (tenant, or admin), the
	// live sandboxes the last successful list there showed: what a list
	// reports as unavailable while that node does not answer. It is a
	// cache, not a record: the node's store is the record.
	mu   sync.Mutex
	seen map[string]map[string][]apitypes.Sandbox

	// view is the capacity placements read, probed at viewAt; placements
	// count themselves into it until the next probe.
	viewMu     sync.Mutex
	view       []probed
	viewAt     time.Time
	refreshing bool // a background probe renews view

	mcp http.Handler // Options.MCP's; nil: not served
}

// New returns the gateway over opt.Discovery's nodes.
func New(opt Options) *Gateway {
	if opt.NodeTimeout <= 0 {
		opt.NodeTimeout = 2 * time.Second
	}
	if opt.ProbeInterval <= 0 {
		opt.ProbeInterval = 250 * time.Millisecond
	}
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = api.DefaultMaxBodyBytes
	}
	if opt.ReconcileInterval <= 0 {
		opt.ReconcileInterval = 10 * time.Second
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Transport == nil {
		// Kept-alive connections to every node: a new TCP connection per
		// forwarded call would cost more than the 2 ms the gateway may add.
		opt.Transport = &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 128, IdleConnTimeout: 90 * time.Second}
	}
	g := &Gateway{opt: opt, log: opt.Log, client: &http.Client{Transport: opt.Transport}, seen: map[string]map[string][]apitypes.Sandbox{}}
	g.handler = http.HandlerFunc(g.serve)
	if opt.Fleet != nil {
		g.handler = audit.Middleware(fleetAudit{opt.Fleet}, "gateway", g.classify, g.handler)
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:   g.rewrite,
		Transport: opt.Transport,
		// Streams (NDJSON exec, events) reach the caller as the node
		// writes them.
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			t, _ := res.Request.Context().Value(targetKey{}).(target)
			if t.retry != nil && res.StatusCode == http.StatusServiceUnavailable {
				// Nothing is written to the caller yet: place again.
				res.Body.Close()
				return errNodeRefused
			}
			ok := res.StatusCode == http.StatusCreated || res.StatusCode == http.StatusOK
			if t.e2bDomain != nil && ok {
				// The E2B SDKs build envd's host name from the answer's
				// domain: the gateway's, not the node's.
				if err := rewriteDomain(res, *t.e2bDomain); err != nil {
					return err
				}
			}
			if t.exposures && ok {
				if err := rewriteExposures(res, g.previewBase()); err != nil {
					return err
				}
			}
			if t.rsv != nil && t.bind && ok {
				return g.bindCreated(res, t.rsv, t.node)
			}
			if t.rsv != nil && !ok {
				// Released before the caller reads the refusal: a retry
				// must find the count as it was.
				g.settle(t.rsv)
			}
			if t.releaseID != "" && res.StatusCode >= 200 && res.StatusCode < 300 {
				g.released(t.releaseID)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t, _ := r.Context().Value(targetKey{}).(target)
			if t.retry != nil {
				t.retry(w)
				return
			}
			g.settle(t.rsv)
			writeError(w, errdefs.Unavailablef("node %s does not answer: %v", t.node, err))
		},
	}
	if opt.MCP != nil {
		g.mcp = opt.MCP(g)
	}
	return g
}

// target is where the proxy sends a request, in its context.
type target struct {
	node string
	url  *url.URL
	// path, when set, replaces the request's path (the drain route).
	path string
	p    *principal.Principal // nil: the gateway's own call (admin)
	// retry, set on a create, places it again when the node does not
	// answer or answers unavailable (a drain this gateway had not seen).
	retry func(w http.ResponseWriter)
	// rsv is a create's fleet reservation, bound to the sandbox the
	// node's answer names when bind is set (a sandbox create, not a run).
	rsv  *reservation
	bind bool
	// releaseID is a sandbox whose terminate this is: released from the
	// fleet's count when the node answers 2xx.
	releaseID string
	// mode says whose credentials go to the node (modeAPI: the
	// gateway's, with the caller's principal).
	mode forwardMode
	// e2bID and port are the sandbox and port of an envd request.
	e2bID string
	port  int
	// e2bDomain, set on E2B control-plane calls, replaces the domain of
	// the node's answer (empty: null).
	e2bDomain *string
	// exposures: the answer's preview URLs are pointed at this gateway.
	exposures bool
}

// forwardMode is how a forwarded request is authorized at the node.
type forwardMode int

const (
	modeAPI     forwardMode = iota // REST and the E2B control plane: the gateway's secret and the caller's principal
	modeEnvd                       // E2B data plane: the caller's sandbox token, routed by E2b-Sandbox-* headers
	modePreview                    // preview URLs: the exposure's own token, routed by host name
)

// errNodeRefused is a node's 503 to a create: placed again.
var errNodeRefused = errors.New("node refused the create")

type targetKey struct{}

// rewrite turns a caller's request into the node's: the caller's
// credentials are dropped and the gateway's put in their place (see
// pkg/api/gateway.go for the node's side of the boundary).
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	pr.SetURL(t.url)
	if t.path != "" {
		pr.Out.URL.Path, pr.Out.URL.RawPath = t.path, ""
	}
	pr.Out.Host = t.url.Host
	pr.SetXForwarded()
	switch t.mode {
	case modeEnvd:
		// The caller's own credentials are the sandbox's (its access
		// token, its envd user), checked by the node; nothing of the
		// gateway's, and nothing a caller forged in its name, goes along.
		pr.Out.Header.Del(api.GatewaySecretHeader)
		pr.Out.Header.Del(api.GatewayPrincipalHeader)
		pr.Out.Header.Set("E2b-Sandbox-Id", t.e2bID)
		pr.Out.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
	case modePreview:
		pr.Out.Header.Del(api.GatewaySecretHeader)
		pr.Out.Header.Del(api.GatewayPrincipalHeader)
		pr.Out.Host = pr.In.Host // the node routes previews by host name
	default:
		pr.Out.Header.Del("X-Api-Key")
		g.authorize(pr.Out.Header, t.p)
	}
}

// authorize replaces whatever credentials h holds by the gateway's.
func (g *Gateway) authorize(h http.Header, p *principal.Principal) {
	h.Del("Authorization")
	h.Del("Cookie")
	h.Set(api.GatewaySecretHeader, g.opt.Secret)
	h.Del(api.GatewayPrincipalHeader)
	if p != nil {
		b, _ := json.Marshal(p) // a struct of strings and a bool
		h.Set(api.GatewayPrincipalHeader, string(b))
	}
}

// ServeHTTP authenticates the caller and places, routes or merges; with
// a fleet store, what changes anything is recorded in the fleet's audit
// rows before its answer.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.handler.ServeHTTP(w, r) }

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	if r.URL.Path == "/login" {
		g.login(w, r)
		return
	}
	p, sess, browser, ok := g.caller(w, r)
	if !ok {
		return
	}
	g.dispatch(w, r, p, sess, browser)
}

// caller authenticates r: a bearer key of the fleet's tenants, or else a
// web editor session (ui.go), checked as on a node before anything is
// served. Not ok: the refusal has been answered.
func (g *Gateway) caller(w http.ResponseWriter, r *http.Request) (p principal.Principal, sess uiClaims, browser, ok bool) {
	p, err := g.authenticate(r)
	if err != nil && r.Header.Get("Authorization") == "" {
		if sess, browser = g.session(r); browser {
			p, err = sess.P, api.BrowserChecks(r, sess.CSRF)
			if err != nil {
				writeError(w, err)
				return p, sess, browser, false
			}
		}
	}
	if err != nil {
		if !isAPIPath(r.URL.Path) && errdefs.Is(err, errdefs.Unauthenticated) {
			api.LoginPage(w, http.StatusUnauthorized, "")
			return p, sess, browser, false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-sandboxd"`)
		writeError(w, err)
		return p, sess, browser, false
	}
	fe := "gateway"
	if browser {
		fe = "web"
	}
	audit.CallFrom(r.Context()).SetPrincipal(p)
	audit.CallFrom(r.Context()).SetOrigin(principal.Origin{FrontEnd: fe, Source: r.RemoteAddr})
	return p, sess, browser, true
}

// dispatch serves an authenticated request of p: the gateway's own
// routes, placement, routing by sandbox id, merged lists, /mcp.
func (g *Gateway) dispatch(w http.ResponseWriter, r *http.Request, p principal.Principal, sess uiClaims, browser bool) {
	path := r.URL.Path
	switch {
	case path == "/v1/ui/login-tokens" && r.Method == http.MethodPost:
		g.mintLogin(w, r, p, browser)
	case path == "/v1/ui/session" && r.Method == http.MethodGet:
		g.uiSession(w, sess, browser)
	case path == "/v1/ui/logout" && r.Method == http.MethodPost:
		g.logout(w, r)
	case g.keys(w, r, p):
	case g.mergedList(w, r, p):
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isAPIPath(path):
		// The web editor's page and assets, served here: its API calls
		// come back to this gateway.
		api.ServeWebUI(w, r)
	case path == "/v1/audit/verify" && r.Method == http.MethodGet:
		if g.admin(w, p) {
			g.auditVerify(w, r)
		}
	case path == "/metrics" && r.Method == http.MethodGet:
		if g.admin(w, p) {
			g.metrics(w, r)
		}
	case path == "/v1/nodes" && r.Method == http.MethodGet:
		if g.admin(w, p) {
			g.listNodes(w, r)
		}
	case strings.HasPrefix(path, "/v1/nodes/") && strings.HasSuffix(path, "/quota-counts") && r.Method == http.MethodDelete:
		if g.admin(w, p) {
			g.releaseNode(w, r, strings.TrimSuffix(strings.TrimPrefix(path, "/v1/nodes/"), "/quota-counts"))
		}
	case strings.HasPrefix(path, "/v1/nodes/") && strings.HasSuffix(path, "/drain") && r.Method == http.MethodPut:
		if g.admin(w, p) {
			g.drain(w, r, strings.TrimSuffix(strings.TrimPrefix(path, "/v1/nodes/"), "/drain"))
		}
	case strings.HasPrefix(path, "/v1/artifacts/") && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		g.artifact(w, r, p, strings.TrimPrefix(path, "/v1/artifacts/"))
	case isUntagged(r):
		probe, _ := untaggedRoute(r.Method, path)
		g.untagged(w, r, p, probe)
	case path == "/v1/ssh/keys" || strings.HasPrefix(path, "/v1/ssh/keys/"):
		g.sshKeys(w, r, p, strings.TrimPrefix(strings.TrimPrefix(path, "/v1/ssh/keys"), "/"))
	case r.Method == http.MethodPost && (path == "/v1/sandboxes" || path == "/v1/run" || path == "/v1/agent/run"):
		g.create(w, r, p)
	case r.Method == http.MethodGet && path == "/v1/sandboxes":
		g.list(w, r, p)
	case strings.HasPrefix(path, "/v1/sandboxes/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(path, "/v1/sandboxes/"), "/")
		g.route(w, r, p, id)
	case path == "/mcp":
		// MCP tool calls carry sandbox ids in their arguments, and a
		// session spans calls: not routable by path, served here over
		// the nodes (fleet.go, docs/ARCHITECTURE.md).
		g.serveMCP(w, r, p)
	default:
		g.any(w, r, p)
	}
}

func (g *Gateway) admin(w http.ResponseWriter, p principal.Principal) bool {
	if !p.Admin {
		writeError(w, errdefs.PermissionDeniedf("needs an admin key (key %s is of scope user)", p.KeyName))
	}
	return p.Admin
}

// authenticate checks the bearer key against the fleet's tenants.
func (g *Gateway) authenticate(r *http.Request) (principal.Principal, error) {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return principal.Principal{}, errdefs.Unauthenticatedf("Authorization: missing bearer key")
	}
	return g.opt.Auth.Authenticate(tok, r.RemoteAddr)
}

// forward proxies r to node n as p.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, n Node, p *principal.Principal, path string) {
	g.forwardRetry(w, r, n, p, path, nil)
}

func (g *Gateway) forwardRetry(w http.ResponseWriter, r *http.Request, n Node, p *principal.Principal, path string, retry func(http.ResponseWriter)) {
	g.forwardTarget(w, r, n, target{path: path, p: p, retry: retry})
}

// forwardTarget proxies r to node n as t says (its node and url are
// filled in here).
func (g *Gateway) forwardTarget(w http.ResponseWriter, r *http.Request, n Node, t target) {
	u, err := url.Parse(n.URL)
	if err != nil {
		writeError(w, errdefs.Wrap(errdefs.Internal, err, "node %s: url %q", n.Name, n.URL))
		return
	}
	t.node, t.url = n.Name, u
	ctx := context.WithValue(r.Context(), targetKey{}, t)
	g.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// route forwards a request about sandbox id to the node its tag names.
func (g *Gateway) route(w http.ResponseWriter, r *http.Request, p principal.Principal, id string) {
	n, err := g.NodeOf(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	t := target{p: &p, exposures: isExposureRoute(r.URL.Path)}
	if r.Method == http.MethodDelete && r.URL.Path == "/v1/sandboxes/"+id {
		t.releaseID = id
	}
	g.forwardTarget(w, r, n, t)
}

// any forwards a request that is about no sandbox (images, languages,
// status) to a node that answers: nodes of a fleet share their
// configuration and images.
func (g *Gateway) any(w http.ResponseWriter, r *http.Request, p principal.Principal) {
	probes := g.probe(r.Context())
	for _, pr := range probes {
		if pr.err == nil {
			g.forward(w, r, pr.node, &p, "")
			return
		}
	}
	writeError(w, errdefs.Unavailablef("no node answers (%s)", summary(probes)))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client left
}

// writeError answers err in the taxonomy's JSON, as the nodes do.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, errhttp.ToHTTP(err), apitypes.ErrorResponse{Error: apitypes.ErrorBodyOf(err)})
}

// probed is one node's answer to GET /v1/node.
type probed struct {
	node Node
	st   *apitypes.NodeStatus
	err  error
}

// probe asks every discovered node for its capacity, in parallel, each
// within NodeTimeout, in discovery's order.
func (g *Gateway) probe(ctx context.Context) []probed {
	nodes, err := g.opt.Discovery.Nodes(ctx)
	if err != nil {
		g.log.Warn("node discovery failed", "err", err)
		return nil
	}
	out := make([]probed, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].node = n
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st apitypes.NodeStatus
			out[i].err = g.call(ctx, n, http.MethodGet, "/v1/node", nil, nil, &st)
			out[i].st = &st
		}()
	}
	wg.Wait()
	return out
}

// call is the gateway's own request to node n, as p (nil: the gateway,
// admin), decoding a 2xx answer into out (nil: the answer is dropped).
func (g *Gateway) call(ctx context.Context, n Node, method, path string, body []byte, p *principal.Principal, out any) error {
	ctx, cancel := context.WithTimeout(ctx, g.opt.NodeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(n.URL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	g.authorize(req.Header, p)
	res, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		var e apitypes.ErrorResponse
		_ = json.Unmarshal(data, &e)
		if res.StatusCode >= 400 && res.StatusCode < 500 && errdefs.Known(errdefs.Code(e.Error.Code)) {
			// The request's fault, in the node's own words: the
			// caller's answer, not a sign the node is gone.
			return errdefs.New(errdefs.Code(e.Error.Code), "%s", e.Error.Message)
		}
		return fmt.Errorf("%s %s: %s %s", method, path, res.Status, e.Error.Message)
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		return nil
	}
	return json.Unmarshal(data, out)
}

func summary(probes []probed) string {
	var parts []string
	for _, p := range probes {
		switch {
		case p.err != nil:
			parts = append(parts, fmt.Sprintf("%s: %v", p.node.Name, p.err))
		case p.st.Draining || p.node.Draining:
			parts = append(parts, p.node.Name+": draining")
		case !p.st.Ready || !p.node.Ready:
			parts = append(parts, p.node.Name+": not ready")
		default:
			parts = append(parts, p.node.Name+": full")
		}
	}
	if len(parts) == 0 {
		return "no nodes discovered"
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}
