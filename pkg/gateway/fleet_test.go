package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// memFleet is FleetStore in memory, with pgstore's semantics (the real
// store is tested in pkg/store/pgstore and test/e2e).
type memFleet struct {
	mu      sync.Mutex
	seq     int
	rows    map[string]*memRow // by reservation
	records []audit.Record
	used    map[string]bool // login nonces
}

type memRow struct {
	key, sandbox, node string
	add                apitypes.KeyUse
}

func (m *memFleet) count(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.rows {
		if r.key == key {
			n++
		}
	}
	return n
}

func (m *memFleet) ReserveSandbox(_ context.Context, key string, add apitypes.KeyUse, q apitypes.Quota) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.rows {
		if r.key == key {
			n++
		}
	}
	if q.Sandboxes > 0 && n+1 > q.Sandboxes {
		return "", errdefs.LimitExceededf("quota sandboxes: key %s may hold %d live sandboxes across the fleet and holds %d", key, q.Sandboxes, n)
	}
	m.seq++
	id := "rsv-" + strconv.Itoa(m.seq)
	m.rows[id] = &memRow{key: key, add: add}
	return id, nil
}

func (m *memFleet) BindSandbox(_ context.Context, rsv, id, node string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rows[rsv]
	if r == nil {
		return errdefs.NotFoundf("reservation: %s", rsv)
	}
	r.sandbox, r.node = id, node
	return nil
}

func (m *memFleet) ReleaseReservation(_ context.Context, rsv string) error {
	m.mu.Lock()
	delete(m.rows, rsv)
	m.mu.Unlock()
	return nil
}

func (m *memFleet) ReleaseSandbox(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.rows {
		if r.sandbox == id {
			delete(m.rows, k)
		}
	}
	return nil
}

func (m *memFleet) Now(context.Context) (time.Time, error) { return time.Now(), nil }

func (m *memFleet) ReconcileNode(_ context.Context, node string, _ time.Time, live []string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, r := range m.rows {
		if r.node != node || r.sandbox == "" {
			continue
		}
		found := false
		for _, id := range live {
			found = found || id == r.sandbox
		}
		if !found {
			delete(m.rows, k)
			n++
		}
	}
	return n, nil
}

func (m *memFleet) ReleaseStale(context.Context, time.Duration) (int, error) { return 0, nil }

func (m *memFleet) ReleaseNode(_ context.Context, node string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, r := range m.rows {
		if r.node == node {
			delete(m.rows, k)
			n++
		}
	}
	return n, nil
}

func (m *memFleet) UseLogin(_ context.Context, n string, _ time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used == nil {
		m.used = map[string]bool{}
	}
	first := !m.used[n]
	m.used[n] = true
	return first, nil
}

func (m *memFleet) Usage(_ context.Context, key string) (apitypes.KeyUse, error) {
	return apitypes.KeyUse{Sandboxes: m.count(key)}, nil
}

func (m *memFleet) AppendAudit(_ context.Context, rec audit.Record) (audit.Record, error) {
	m.mu.Lock()
	m.records = append(m.records, rec)
	m.mu.Unlock()
	return rec, nil
}

func (m *memFleet) VerifyAudit(context.Context) (*apitypes.AuditReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &apitypes.AuditReport{OK: true, Records: uint64(len(m.records))}, nil
}

func (m *memFleet) actions() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.records {
		out = append(out, r.Action+" "+r.Target+" "+r.KeyName+" "+r.Outcome)
	}
	return out
}

// quotaKeys gives key-u a quota.
type quotaKeys struct{ n int }

func (q quotaKeys) Key(id string) (apitypes.Key, bool) {
	return apitypes.Key{ID: id, Quota: apitypes.Quota{Sandboxes: q.n}}, true
}

// fleetNode is a node with a REST, an E2B and a preview listener, whose
// live sandboxes are what it created and not yet terminated.
type fleetNode struct {
	name  string
	mu    sync.Mutex
	live  map[string]bool
	seq   int
	seen  []*http.Request // E2B and preview requests, with their headers
	rest  *httptest.Server
	e2b   *httptest.Server
	prev  *httptest.Server
	fails bool // creates answer 400
}

func newFleetNode(t *testing.T, name string) *fleetNode {
	n := &fleetNode{name: name, live: map[string]bool{}}
	// The E2B and preview listeners share the REST listener's host (the
	// gateway reaches them there), each on a port of its own.
	n.e2b = httptest.NewServer(http.HandlerFunc(n.serveE2B))
	n.prev = httptest.NewServer(http.HandlerFunc(n.servePreview))
	n.rest = httptest.NewServer(http.HandlerFunc(n.serveREST))
	t.Cleanup(func() { n.rest.Close(); n.e2b.Close(); n.prev.Close() })
	return n
}

func (n *fleetNode) newID() string {
	n.seq++
	return "sb-" + sandbox.NodeTag(n.name) + strings.Repeat("0", 11) + strconv.Itoa(n.seq%10)
}

func (n *fleetNode) serveREST(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case r.URL.Path == "/v1/node":
		u1, _ := url.Parse(n.e2b.URL)
		u2, _ := url.Parse(n.prev.URL)
		_, p1, _ := net.SplitHostPort(u1.Host)
		_, p2, _ := net.SplitHostPort(u2.Host)
		e, _ := strconv.Atoi(p1)
		p, _ := strconv.Atoi(p2)
		writeJSON(w, http.StatusOK, apitypes.NodeStatus{Name: n.name, Ready: true, MaxSandboxes: 10, Images: []string{"shell"},
			Live: len(n.live), Defaults: apitypes.Limits{MemoryBytes: 256 << 20, CPUs: 1}, E2BPort: e, PreviewPort: p})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" && n.fails:
		writeJSON(w, http.StatusBadRequest, apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: "invalid_argument", Message: "image: no such image"}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes":
		id := n.newID()
		n.live[id] = true
		writeJSON(w, http.StatusCreated, apitypes.Sandbox{ID: id, State: apitypes.StateReady})
	case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes":
		l := apitypes.SandboxList{Sandboxes: []apitypes.Sandbox{}}
		for id := range n.live {
			l.Sandboxes = append(l.Sandboxes, apitypes.Sandbox{ID: id, State: apitypes.StateReady})
		}
		writeJSON(w, http.StatusOK, l)
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
		delete(n.live, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
		writeJSON(w, http.StatusOK, apitypes.Sandbox{})
	case strings.HasSuffix(r.URL.Path, "/ports"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/ports")
		x := apitypes.PortExposure{SandboxID: id, Port: 8000, Token: "tok", BaseURL: n.prev.URL + "/preview/" + id + "/8000/",
			URL: n.prev.URL + "/preview/" + id + "/8000/?sandboxd_preview_token=tok", HostURL: "http://p8000-" + id + ".localhost:7071/?sandboxd_preview_token=tok"}
		if r.Method == http.MethodGet {
			writeJSON(w, http.StatusOK, apitypes.PortList{Ports: []apitypes.PortExposure{x}})
		} else {
			writeJSON(w, http.StatusCreated, x)
		}
	default:
		writeJSON(w, http.StatusOK, map[string]string{"node": n.name})
	}
}

func (n *fleetNode) serveE2B(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	n.seen = append(n.seen, r.Clone(context.Background()))
	defer n.mu.Unlock()
	switch {
	case r.Header.Get("E2b-Sandbox-Id") != "":
		// envd: a server stream of three messages, flushed one by one.
		w.Header().Set("Content-Type", "application/connect+json")
		for i := range 3 {
			_, _ = io.WriteString(w, "msg-"+strconv.Itoa(i)+"\n")
			http.NewResponseController(w).Flush()
			n.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			n.mu.Lock()
		}
	case r.Method == http.MethodPost && r.URL.Path == "/sandboxes":
		id := n.newID()
		n.live[id] = true
		writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": "sb" + strings.TrimPrefix(id, "sb-"), "domain": n.name + ".internal"})
	case r.Method == http.MethodGet && r.URL.Path == "/v2/sandboxes":
		var l []map[string]string
		for id := range n.live {
			l = append(l, map[string]string{"sandboxID": "sb" + strings.TrimPrefix(id, "sb-")})
		}
		writeJSON(w, http.StatusOK, l)
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/sandboxes/"):
		delete(n.live, "sb-"+strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/sandboxes/"), "sb"))
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusOK, map[string]string{"node": n.name})
	}
}

func (n *fleetNode) servePreview(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	n.seen = append(n.seen, r.Clone(context.Background()))
	n.mu.Unlock()
	_, _ = io.WriteString(w, "preview on "+n.name+" for "+r.Host+" "+r.URL.Path)
}

func (n *fleetNode) lastSeen() *http.Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seen[len(n.seen)-1]
}

// TestFleetAccounting: creates are counted against the key's fleet quota
// before placement and refused past it; a failed create releases its
// count, a terminate through the gateway releases at once, and a sandbox
// that ends on its node is released by reconciliation; the calls are in
// the audit rows with the caller and the new sandbox's id.
func TestFleetAccounting(t *testing.T) {
	a := newFleetNode(t, "node-a")
	fleet := &memFleet{rows: map[string]*memRow{}}
	g := New(Options{Discovery: Static{{Name: "node-a", URL: a.rest.URL}}, Auth: keyAuth{}, Keys: quotaKeys{2}, Fleet: fleet, Secret: "the-gateway-secret"})
	gs := httptest.NewServer(g)
	defer gs.Close()
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, gs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer user-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	var ids []string
	for range 2 {
		code, body := do("POST", "/v1/sandboxes", `{"language":"shell"}`)
		var sb apitypes.Sandbox
		if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil {
			t.Fatalf("create: %d %s", code, body)
		}
		ids = append(ids, sb.ID)
	}
	if code, body := do("POST", "/v1/sandboxes", `{"language":"shell"}`); code != http.StatusTooManyRequests || !strings.Contains(body, "quota sandboxes") {
		t.Fatalf("a create past the quota: %d %s, want 429 naming it", code, body)
	}
	if n := fleet.count("key-u"); n != 2 {
		t.Fatalf("counted %d, want 2", n)
	}
	// A run in an existing sandbox goes to its node, counted as nothing
	// new (the quota is full); one in a sandbox of no node is not_found.
	if code, body := do("POST", "/v1/run", `{"language":"shell","code":"true","sandbox_id":"`+ids[0]+`"}`); code != http.StatusOK || !strings.Contains(body, "node-a") {
		t.Errorf("a run in %s: %d %s, want node-a's answer", ids[0], code, body)
	}
	if code, _ := do("POST", "/v1/run", `{"language":"shell","code":"true","sandbox_id":"sb-ffffffff000000000001"}`); code != http.StatusNotFound {
		t.Errorf("a run in a sandbox of no node: %d, want 404", code)
	}
	for _, r := range fleet.rows {
		if r.add.MemoryMB != 256 || r.add.CPUs != 1 || r.node != "node-a" || r.sandbox == "" {
			t.Errorf("a reservation %+v: want the node's defaults (256 MiB, 1 CPU), bound to node-a", r)
		}
	}
	if code, _ := do("DELETE", "/v1/sandboxes/"+ids[0], ""); code != http.StatusOK {
		t.Fatalf("terminate: %d", code)
	}
	if n := fleet.count("key-u"); n != 1 {
		t.Fatalf("counted %d after a terminate, want 1", n)
	}
	// A create the node refuses releases its count.
	a.mu.Lock()
	a.fails = true
	a.mu.Unlock()
	if code, _ := do("POST", "/v1/sandboxes", `{"image":"nope","memory_mb":64}`); code != http.StatusBadRequest {
		t.Fatalf("a refused create: %d", code)
	}
	if n := fleet.count("key-u"); n != 1 {
		t.Fatalf("counted %d after a refused create, want 1", n)
	}
	// The other sandbox ends on its node (expiry): reconciled.
	a.mu.Lock()
	a.fails = false
	delete(a.live, ids[1])
	a.mu.Unlock()
	g.ReconcileOnce(context.Background())
	if n := fleet.count("key-u"); n != 0 {
		t.Fatalf("counted %d after reconciling, want 0", n)
	}
	// A node gone for good: refused while it answers.
	req, _ := http.NewRequest("DELETE", gs.URL+"/v1/nodes/node-a/quota-counts", nil)
	req.Header.Set("Authorization", "Bearer admin-key")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusConflict {
		t.Errorf("release of an answering node's counts: %d, want 409", res.StatusCode)
	}
	acts := strings.Join(fleet.actions(), "\n")
	for _, want := range []string{"POST /v1/sandboxes " + ids[0] + " u success", "DELETE /v1/sandboxes/{id} " + ids[0] + " u success", "POST /v1/sandboxes  u failure"} {
		if !strings.Contains(acts, want) {
			t.Errorf("audit rows lack %q:\n%s", want, acts)
		}
	}
	// An authentication failure is recorded too.
	req, _ = http.NewRequest("GET", gs.URL+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer stolen")
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
	}
	if acts := strings.Join(fleet.actions(), "\n"); !strings.Contains(acts, "authenticate GET /v1/sandboxes  failure") {
		t.Errorf("audit rows lack the authentication failure:\n%s", acts)
	}
}

// TestE2BAndPreviewRouting: the E2B control plane authenticates the API
// key at the gateway and forwards the principal, never the key; creates
// are placed and counted, lists merged; envd requests keep the caller's
// sandbox credentials, lose forged gateway headers, carry the routing as
// headers (from a host name too) and stream through as the node writes;
// previews reach the node whose tag the id carries, host kept.
func TestE2BAndPreviewRouting(t *testing.T) {
	a, b := newFleetNode(t, "node-a"), newFleetNode(t, "node-b")
	fleet := &memFleet{rows: map[string]*memRow{}}
	g := New(Options{Discovery: Static{{Name: "node-a", URL: a.rest.URL}, {Name: "node-b", URL: b.rest.URL}}, Auth: keyAuth{}, Keys: quotaKeys{0}, Fleet: fleet, Secret: "the-gateway-secret"})
	es := httptest.NewServer(g.E2B("e2b.test"))
	defer es.Close()
	ps := httptest.NewServer(g.Preview())
	defer ps.Close()

	do := func(method, path string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest(method, es.URL+path, nil)
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res, string(body)
	}
	if res, _ := do("GET", "/v2/sandboxes", nil); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("E2B list without a key: %d", res.StatusCode)
	}
	if res, _ := do("GET", "/v2/sandboxes", map[string]string{"X-API-Key": "wrong"}); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("E2B list with a wrong key: %d", res.StatusCode)
	}
	var e2bIDs []string
	for range 4 {
		res, body := do("POST", "/sandboxes", map[string]string{"X-API-Key": "user-key"})
		var sb struct {
			SandboxID string `json:"sandboxID"`
			Domain    string `json:"domain"`
		}
		if res.StatusCode != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil || sb.Domain != "e2b.test" {
			t.Fatalf("E2B create: %d %s (want the gateway's domain)", res.StatusCode, body)
		}
		e2bIDs = append(e2bIDs, sb.SandboxID)
	}
	if n := fleet.count("key-u"); n != 4 {
		t.Errorf("E2B creates counted %d, want 4", n)
	}
	h := a.lastSeen().Header
	if len(a.live) == 0 || len(b.live) == 0 {
		t.Errorf("4 E2B creates over two nodes: %d and %d", len(a.live), len(b.live))
	}
	if h.Get("X-Api-Key") != "" || h.Get(api.GatewaySecretHeader) != "the-gateway-secret" || !strings.Contains(h.Get(api.GatewayPrincipalHeader), `"key_id":"key-u"`) {
		t.Errorf("an E2B create reached its node with %v", h)
	}
	res, body := do("GET", "/v2/sandboxes", map[string]string{"X-API-Key": "user-key"})
	var listed []map[string]string
	if res.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &listed) != nil || len(listed) != 4 {
		t.Errorf("merged E2B list: %d %s", res.StatusCode, body)
	}
	// Kill one: routed to its node, released.
	id, _ := fromE2B(e2bIDs[0])
	if res, body := do("DELETE", "/sandboxes/"+e2bIDs[0], map[string]string{"X-API-Key": "user-key"}); res.StatusCode != http.StatusNoContent {
		t.Errorf("E2B kill: %d %s", res.StatusCode, body)
	}
	if n := fleet.count("key-u"); n != 3 {
		t.Errorf("after a kill counted %d, want 3", n)
	}
	owner := a
	if tag, _ := sandbox.IDNodeTag(id); tag == sandbox.NodeTag("node-b") {
		owner = b
	}
	// envd by header: the caller's token kept, forged gateway headers
	// dropped, streamed as written.
	start := time.Now()
	req, _ := http.NewRequest("POST", es.URL+"/process.Process/Start", nil)
	req.Header.Set("E2b-Sandbox-Id", e2bIDs[0])
	req.Header.Set("X-Access-Token", "sandbox-token")
	req.Header.Set("Authorization", "Basic dXNlcjo=")
	req.Header.Set(api.GatewaySecretHeader, "guessed")
	req.Header.Set(api.GatewayPrincipalHeader, `{"tenant":"admin","admin":true}`)
	sres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 6)
	if _, err := io.ReadFull(sres.Body, first); err != nil || string(first) != "msg-0\n" {
		t.Fatalf("envd stream's first message: %q %v", first, err)
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Errorf("the first streamed message took %v: buffered by the gateway", d)
	}
	rest, _ := io.ReadAll(sres.Body)
	sres.Body.Close()
	if string(rest) != "msg-1\nmsg-2\n" {
		t.Errorf("envd stream's rest: %q", rest)
	}
	eh := owner.lastSeen().Header
	if eh.Get("X-Access-Token") != "sandbox-token" || eh.Get("Authorization") != "Basic dXNlcjo=" || eh.Get(api.GatewaySecretHeader) != "" ||
		eh.Get(api.GatewayPrincipalHeader) != "" || eh.Get("E2b-Sandbox-Id") != e2bIDs[0] || eh.Get("E2b-Sandbox-Port") != "49983" {
		t.Errorf("envd reached %s with %v", owner.name, eh)
	}
	// envd by host name.
	if res, _ := do("GET", "/health", map[string]string{"Host": "8080-" + e2bIDs[0] + ".e2b.test"}); res.StatusCode != http.StatusOK {
		t.Errorf("relay by host name: %d", res.StatusCode)
	}
	if eh := owner.lastSeen().Header; eh.Get("E2b-Sandbox-Id") != e2bIDs[0] || eh.Get("E2b-Sandbox-Port") != "8080" {
		t.Errorf("relay by host name reached the node with %v", eh)
	}
	// A sandbox of no node, and a malformed id.
	for _, bad := range []string{"sbffffffff000000000000", "../../etc"} {
		if res, _ := do("GET", "/health", map[string]string{"E2b-Sandbox-Id": bad}); res.StatusCode != http.StatusBadGateway {
			t.Errorf("envd of %q: %d, want 502", bad, res.StatusCode)
		}
	}

	// Previews: path form and host-name form reach the owner.
	pid := "sb-" + sandbox.NodeTag(owner.name) + "00000000000a"
	for _, tc := range []struct{ host, path string }{{"", "/preview/" + pid + "/8000/x"}, {"p8000-" + pid + ".localhost", "/x"}} {
		req, _ := http.NewRequest("GET", ps.URL+tc.path, nil)
		if tc.host != "" {
			req.Host = tc.host
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "preview on "+owner.name) || !strings.HasSuffix(string(b), tc.path) {
			t.Errorf("preview %s%s: %d %s", tc.host, tc.path, res.StatusCode, b)
		}
	}
	for _, bad := range []string{"/preview/sb-ffffffff00000000000a/8000/", "/elsewhere"} {
		res, err := http.Get(ps.URL + bad)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("preview %s: %d, want 404", bad, res.StatusCode)
		}
	}
}

// TestExposureURLs: exposures answered through a gateway name its preview
// listener (path and token kept; the host-name form only on a loopback
// base, with its port), in an expose's answer and in a list; without a
// preview URL they pass unchanged.
func TestExposureURLs(t *testing.T) {
	a := newFleetNode(t, "node-a")
	g := New(Options{Discovery: Static{{Name: "node-a", URL: a.rest.URL}}, Auth: keyAuth{}, Secret: "the-gateway-secret"})
	gs := httptest.NewServer(g)
	defer gs.Close()
	id := "sb-" + sandbox.NodeTag("node-a") + "00000000000a"
	get := func(method string) []apitypes.PortExposure {
		req, _ := http.NewRequest(method, gs.URL+"/v1/sandboxes/"+id+"/ports", strings.NewReader(`{"port":8000}`))
		req.Header.Set("Authorization", "Bearer user-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if method == http.MethodGet {
			var l apitypes.PortList
			if err := json.Unmarshal(b, &l); err != nil {
				t.Fatalf("%s: %v %s", method, err, b)
			}
			return l.Ports
		}
		var x apitypes.PortExposure
		if err := json.Unmarshal(b, &x); err != nil {
			t.Fatalf("%s: %v %s", method, err, b)
		}
		return []apitypes.PortExposure{x}
	}
	if x := get(http.MethodPost)[0]; !strings.HasPrefix(x.BaseURL, a.prev.URL) {
		t.Errorf("without a preview URL: %+v, want the node's", x)
	}
	for _, tc := range []struct{ base, host string }{
		{"https://preview.example.com", ""},
		{"http://127.0.0.1:7082", "http://p8000-" + id + ".localhost:7082/?sandboxd_preview_token=tok"},
	} {
		g.SetPreviewURL(tc.base + "/")
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			x := get(method)[0]
			if x.BaseURL != tc.base+"/preview/"+id+"/8000/" || x.URL != x.BaseURL+"?sandboxd_preview_token=tok" || x.HostURL != tc.host || x.Token != "tok" || x.Port != 8000 {
				t.Errorf("%s through a gateway at %s: %+v", method, tc.base, x)
			}
		}
	}
}
