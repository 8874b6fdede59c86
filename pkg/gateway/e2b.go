package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The E2B API through the gateway (gateway.e2b_listen). As for REST, the
// nodes' own E2B front end (pkg/e2b on each node's e2b.listen) answers:
// the gateway authenticates the control plane's X-API-Key against the
// fleet's tenants, places creates, merges lists and routes every call
// about one sandbox by the node tag its id carries (E2B ids are ours
// without the dash). The data plane (envd, and relayed sandbox ports) is
// routed by the E2b-Sandbox-Id / E2b-Sandbox-Port headers or the host name
// {port}-{id}.{domain}, and proxied with the caller's own credentials (the
// sandbox's access token), streams flushed as they come.

// envdPort is envd's port in an E2B sandbox (pkg/e2b.EnvdPort).
const envdPort = 49983

var e2bIDRe = regexp.MustCompile(`^sb[0-9a-f]{1,62}$`)

// fromE2B is our id of an E2B sandbox id (pkg/e2b.FromE2B).
func fromE2B(e string) (string, bool) {
	e = strings.TrimSuffix(e, "-6532622b") // the SDKs' legacy client id
	if !e2bIDRe.MatchString(e) {
		return "", false
	}
	return "sb-" + e[2:], true
}

// E2B returns the handler of the gateway's E2B listener; domain is its
// host-name routing domain (gateway.e2b_domain, may be empty).
func (g *Gateway) E2B(domain string) http.Handler {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveE2B(w, r, domain) })
	if g.opt.Fleet != nil {
		h = audit.Middleware(fleetAudit{g.opt.Fleet}, "e2b", func(r *http.Request) audit.Classification { return classifyE2B(r, domain) }, h)
	}
	return h
}

// e2bRoute finds the sandbox and port of a data-plane request: headers
// first, then a host name under domain.
func e2bRoute(r *http.Request, domain string) (id string, port int, ok bool) {
	if h := r.Header.Get("E2b-Sandbox-Id"); h != "" {
		port := envdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				n = -1
			}
			port = n
		}
		return h, port, true
	}
	if domain != "" {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(domain)); ok && !strings.Contains(label, ".") {
			p, sid, ok := strings.Cut(label, "-")
			if n, err := strconv.Atoi(p); ok && err == nil && n > 0 && n <= 65535 {
				return sid, n, true
			}
			return label, -1, true
		}
	}
	return "", 0, false
}

// classifyE2B: control-plane calls that change anything are recorded by
// the gateway; envd calls by the node that serves them.
func classifyE2B(r *http.Request, domain string) audit.Classification {
	if _, _, ok := e2bRoute(r, domain); ok {
		return audit.Classification{Action: r.Method + " envd"}
	}
	k := audit.Classification{Action: r.Method + " " + r.URL.Path}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i, p := range parts {
		if p == "sandboxes" && i+1 < len(parts) {
			k.Target, parts[i+1] = parts[i+1], "{id}"
			k.Action = r.Method + " /" + strings.Join(parts, "/")
		}
	}
	k.Changes = r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != "/health"
	return k
}

// e2bError answers in E2B's error object ({code, message}, code the HTTP
// status), which the SDKs branch on.
func e2bError(w http.ResponseWriter, err error) {
	st := errhttp.ToHTTP(err)
	writeJSON(w, st, map[string]any{"code": st, "message": errdefs.MessageOf(err)})
}

func (g *Gateway) serveE2B(w http.ResponseWriter, r *http.Request, domain string) {
	if id, port, ok := e2bRoute(r, domain); ok {
		g.envd(w, r, id, port)
		return
	}
	path := r.URL.Path
	if path == "/health" {
		_, _ = io.WriteString(w, "Health check successful\n")
		return
	}
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		e2bError(w, errdefs.Unauthenticatedf("missing X-API-Key header"))
		return
	}
	p, err := g.opt.Auth.Authenticate(key, r.RemoteAddr)
	if err != nil {
		if !errdefs.Is(err, errdefs.LimitExceeded) {
			err = errdefs.Unauthenticatedf("invalid API key")
		}
		e2bError(w, err)
		return
	}
	audit.CallFrom(r.Context()).SetPrincipal(p)
	audit.CallFrom(r.Context()).SetOrigin(principal.Origin{FrontEnd: "gateway", Source: r.RemoteAddr})
	rest, v2 := strings.CutPrefix(path, "/v2")
	switch {
	case r.Method == http.MethodPost && rest == "/sandboxes":
		g.e2bCreate(w, r, p, domain)
	case r.Method == http.MethodGet && path == "/sandboxes":
		g.e2bList(w, r, p, false)
	case r.Method == http.MethodGet && path == "/v2/sandboxes":
		g.e2bList(w, r, p, true)
	case strings.HasPrefix(rest, "/sandboxes/"):
		eid, sub, _ := strings.Cut(strings.TrimPrefix(rest, "/sandboxes/"), "/")
		id, ok := fromE2B(eid)
		n, err := g.NodeOf(r.Context(), id)
		if !ok || err != nil {
			if err == nil || errdefs.Is(err, errdefs.NotFound) {
				err = errdefs.NotFoundf("sandbox %q not found", eid)
			}
			e2bError(w, err)
			return
		}
		t := target{p: &p, e2bDomain: &domain}
		if r.Method == http.MethodDelete && sub == "" && !v2 {
			t.releaseID = id
		}
		g.forwardE2B(w, r, n, t)
	default:
		// Templates and whatever else is about no sandbox: any node
		// (a fleet's nodes share their configuration and images).
		for _, pr := range g.probe(r.Context()) {
			if pr.err == nil && pr.st.E2BPort > 0 {
				g.forwardE2B(w, r, pr.node, target{p: &p})
				return
			}
		}
		e2bError(w, errdefs.Unavailablef("no node serves the E2B API"))
	}
}

// listenerURL is node n's listener on port (its E2B or preview listener):
// the host of its REST URL.
func listenerURL(n Node, port int) (string, error) {
	u, err := url.Parse(n.URL)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "node %s: url %q", n.Name, n.URL)
	}
	return "http://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port)), nil
}

// nodePorts is node n's E2B and preview ports, from the capacity view (a
// probe of n when the view does not hold it).
func (g *Gateway) nodePorts(ctx context.Context, n Node) (e2b, preview int, err error) {
	g.viewMu.Lock()
	for _, pr := range g.view {
		if pr.node.Name == n.Name && pr.err == nil {
			e2b, preview = pr.st.E2BPort, pr.st.PreviewPort
		}
	}
	g.viewMu.Unlock()
	if e2b > 0 || preview > 0 {
		return e2b, preview, nil
	}
	var st apitypes.NodeStatus
	if err := g.call(ctx, n, http.MethodGet, "/v1/node", nil, nil, &st); err != nil {
		return 0, 0, errdefs.Unavailablef("node %s does not answer: %v", n.Name, err)
	}
	return st.E2BPort, st.PreviewPort, nil
}

// rewriteDomain sets the "domain" of a JSON object answer to domain (null
// when empty); other answers pass unchanged.
func rewriteDomain(res *http.Response, domain string) error {
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	res.Body.Close()
	if err != nil {
		return err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) == nil {
		if _, ok := obj["domain"]; ok {
			obj["domain"] = json.RawMessage("null")
			if domain != "" {
				obj["domain"], _ = json.Marshal(domain)
			}
			if b, err := json.Marshal(obj); err == nil {
				body = append(b, '\n')
			}
		}
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	res.ContentLength = int64(len(body))
	res.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// forwardE2B proxies a request to node n's E2B listener.
func (g *Gateway) forwardE2B(w http.ResponseWriter, r *http.Request, n Node, t target) {
	port, _, err := g.nodePorts(r.Context(), n)
	if err == nil && port == 0 {
		err = errdefs.Unavailablef("node %s serves no E2B API (e2b.listen)", n.Name)
	}
	if err != nil {
		g.settle(t.rsv)
		e2bError(w, err)
		return
	}
	base, err := listenerURL(n, port)
	if err != nil {
		g.settle(t.rsv)
		e2bError(w, err)
		return
	}
	n.URL = base
	g.forwardTarget(w, r, n, t)
}

// envd proxies a data-plane request to the E2B listener of the node that
// holds sandbox e2bID; the node checks the sandbox's access token.
func (g *Gateway) envd(w http.ResponseWriter, r *http.Request, e2bID string, port int) {
	id, ok := fromE2B(e2bID)
	var n Node
	var err error
	if ok {
		n, err = g.NodeOf(r.Context(), id)
	}
	if !ok || err != nil {
		// E2B's proxy answer for a sandbox that is not there: the SDKs
		// read 502 as "not running".
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": e2bID, "message": "sandbox not found", "code": http.StatusBadGateway})
		return
	}
	g.forwardE2B(w, r, n, target{mode: modeEnvd, e2bID: e2bID, port: port})
}

// e2bCreate places an E2B create on a node that serves the E2B API,
// counted against the key's fleet quota like a REST create.
func (g *Gateway) e2bCreate(w http.ResponseWriter, r *http.Request, p principal.Principal, domain string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		e2bError(w, errdefs.LimitExceededf("body: %v", err))
		return
	}
	h := placeHints{e2b: true, e2bDomain: &domain}
	rsv, err := g.reserve(r.Context(), p, h)
	if err != nil {
		e2bError(w, err)
		return
	}
	defer g.settle(rsv)
	g.createOn(w, r, p, body, h, map[string]bool{}, time.Now(), rsv)
}

// e2bList merges every node's list (v2: paged by id, as each node pages).
func (g *Gateway) e2bList(w http.ResponseWriter, r *http.Request, p principal.Principal, v2 bool) {
	nodes, err := g.opt.Discovery.Nodes(r.Context())
	if err != nil {
		e2bError(w, errdefs.Unavailablef("node discovery: %v", err))
		return
	}
	type answer struct {
		items []json.RawMessage
		next  bool
		err   error
	}
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &answers[i]
			port, _, err := g.nodePorts(r.Context(), n)
			if err != nil || port == 0 {
				a.err = fmt.Errorf("node %s serves no E2B API", n.Name)
				return
			}
			base, _ := listenerURL(n, port)
			a.items, a.next, a.err = g.e2bListNode(r.Context(), base, r.URL.RequestURI(), &p)
		}()
	}
	wg.Wait()
	var all []json.RawMessage
	more := false
	for i, a := range answers {
		var c *errdefs.Error
		if errors.As(a.err, &c) {
			e2bError(w, a.err) // the request's fault (a bad filter), in the node's words
			return
		}
		if a.err != nil {
			g.log.Warn("node does not answer an E2B list", "node", nodes[i].Name, "err", a.err)
			continue
		}
		all = append(all, a.items...)
		more = more || a.next
	}
	idOf := func(m json.RawMessage) string {
		var s struct {
			SandboxID string `json:"sandboxID"`
		}
		_ = json.Unmarshal(m, &s)
		return s.SandboxID
	}
	sort.SliceStable(all, func(i, j int) bool { return idOf(all[i]) < idOf(all[j]) })
	if v2 {
		limit := 100
		if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n > 0 {
			limit = n
		}
		if len(all) > limit {
			all, more = all[:limit], true
		}
		if more && len(all) > 0 {
			w.Header().Set("X-Next-Token", idOf(all[len(all)-1]))
		}
	}
	if all == nil {
		all = []json.RawMessage{}
	}
	writeJSON(w, http.StatusOK, all)
}

// e2bListNode is one node's E2B list as p.
func (g *Gateway) e2bListNode(ctx context.Context, base, uri string, p *principal.Principal) ([]json.RawMessage, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opt.NodeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+uri, nil)
	if err != nil {
		return nil, false, err
	}
	g.authorize(req.Header, p)
	res, err := g.client.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, false, err
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(data, &e)
		if res.StatusCode == http.StatusBadRequest {
			return nil, false, errdefs.Invalidf("%s", e.Message)
		}
		return nil, false, fmt.Errorf("%s: %s", res.Status, e.Message)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		return nil, false, err
	}
	return items, res.Header.Get("X-Next-Token") != "", nil
}
