package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// keyAuth admits one user key and one admin key.
type keyAuth struct{}

func (keyAuth) Authenticate(secret, _ string) (principal.Principal, error) {
	switch secret {
	case "user-key":
		return principal.Principal{KeyID: "key-u", KeyName: "u", Tenant: "u"}, nil
	case "admin-key":
		return principal.Principal{KeyID: "key-a", KeyName: "a", Tenant: "admin", Admin: true}, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("missing or invalid API key")
}

func (keyAuth) Valid(string) bool { return true }

// fakeNode records what reached it and answers like a node.
type fakeNode struct {
	name     string
	mu       sync.Mutex
	headers  []http.Header
	paths    []string
	draining bool // answers creates 503
}

func (n *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	n.headers, n.paths = append(n.headers, r.Header.Clone()), append(n.paths, r.Method+" "+r.URL.Path)
	draining := n.draining
	n.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/v1/node":
		_ = json.NewEncoder(w).Encode(apitypes.NodeStatus{Name: n.name, Ready: true, MaxSandboxes: 10, Images: []string{"shell"}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" && draining:
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: "unavailable", Message: "draining"}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes":
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(apitypes.Sandbox{ID: "sb-" + sandbox.NodeTag(n.name) + "000000000000"})
	default:
		_, _ = io.WriteString(w, `{"node":"`+n.name+`"}`)
	}
}

func (n *fakeNode) last() (string, http.Header) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paths[len(n.paths)-1], n.headers[len(n.headers)-1]
}

// TestGatewayForwarding: the caller's credentials never reach a node; a
// principal header the caller forges is replaced by the one the gateway
// authenticated; requests about a sandbox reach the node its id names;
// a create a node refuses is placed on another.
func TestGatewayForwarding(t *testing.T) {
	a, b := &fakeNode{name: "node-a", draining: true}, &fakeNode{name: "node-b"}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	g := New(Options{Discovery: Static{{Name: "node-a", URL: sa.URL}, {Name: "node-b", URL: sb.URL}}, Auth: keyAuth{}, Secret: "the-gateway-secret"})
	gs := httptest.NewServer(g)
	defer gs.Close()

	do := func(method, path, key string, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest(method, gs.URL+path, strings.NewReader(`{"language":"shell"}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}

	if code, _ := do("GET", "/v1/images", "", nil); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	if code, _ := do("GET", "/v1/images", "wrong", nil); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d, want 401", code)
	}
	forged := map[string]string{
		api.GatewayPrincipalHeader: `{"tenant":"admin","admin":true}`,
		api.GatewaySecretHeader:    "guessed",
		"Cookie":                   "sandboxd_session=stolen",
	}
	id := "sb-" + sandbox.NodeTag("node-b") + "0123456789ab"
	code, body := do("POST", "/v1/sandboxes/"+id+"/exec", "user-key", forged)
	if code != http.StatusOK || !strings.Contains(body, "node-b") {
		t.Fatalf("exec routed: %d %s, want node-b's answer", code, body)
	}
	path, h := b.last()
	if path != "POST /v1/sandboxes/"+id+"/exec" {
		t.Errorf("node-b saw %s", path)
	}
	if h.Get("Authorization") != "" || h.Get("Cookie") != "" {
		t.Errorf("the caller's credentials reached the node: %q %q", h.Get("Authorization"), h.Get("Cookie"))
	}
	if h.Get(api.GatewaySecretHeader) != "the-gateway-secret" {
		t.Errorf("secret header %q", h.Get(api.GatewaySecretHeader))
	}
	var p principal.Principal
	if err := json.Unmarshal([]byte(h.Get(api.GatewayPrincipalHeader)), &p); err != nil || p.Tenant != "u" || p.Admin {
		t.Errorf("forwarded principal %q (%v), want the user's", h.Get(api.GatewayPrincipalHeader), err)
	}

	// Ids that name no node, or are no ids.
	if code, _ := do("GET", "/v1/sandboxes/sb-ffffffff0123456789ab", "user-key", nil); code != http.StatusNotFound {
		t.Errorf("unknown node tag: %d, want 404", code)
	}
	if code, _ := do("GET", "/v1/sandboxes/sb-0123456789ab", "user-key", nil); code != http.StatusNotFound {
		t.Errorf("a lone daemon's id: %d, want 404", code)
	}

	// node-a refuses creates (draining unseen): each lands on node-b.
	for range 4 {
		code, body := do("POST", "/v1/sandboxes", "user-key", nil)
		if code != http.StatusCreated || !strings.Contains(body, sandbox.NodeTag("node-b")) {
			t.Fatalf("create: %d %s, want node-b's sandbox", code, body)
		}
	}

	// Admin routes.
	if code, _ := do("GET", "/v1/nodes", "user-key", nil); code != http.StatusForbidden {
		t.Errorf("user GET /v1/nodes: %d, want 403", code)
	}
	if code, _ := do("PUT", "/v1/nodes/node-c/drain", "admin-key", nil); code != http.StatusNotFound {
		t.Errorf("drain of an unknown node: %d, want 404", code)
	}
	if code, _ := do("PUT", "/v1/nodes/node-a/drain", "admin-key", nil); code != http.StatusOK {
		t.Errorf("drain: %d", code)
	}
	if path, h := a.last(); path != "PUT /v1/node/drain" || h.Get(api.GatewayPrincipalHeader) != "" {
		t.Errorf("node-a saw %s with principal %q, want PUT /v1/node/drain as the gateway", path, h.Get(api.GatewayPrincipalHeader))
	}
	if code, _ := do("POST", "/mcp", "user-key", nil); code != http.StatusServiceUnavailable {
		t.Errorf("/mcp: %d, want 503 until the gateway serves MCP", code)
	}
}
