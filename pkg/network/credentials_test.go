package network

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

const (
	fakeAPIPort    = 8088
	credProxyPort  = 8119
	testSecret     = "sk-test-REAL-SECRET-0123456789"
	credentialName = "anthropic"
)

// fakeAPI is an upstream in the upstream namespace that records the key
// each request carried and answers with usage, as JSON or as an SSE
// stream (?stream=1).
type fakeAPI struct {
	mu   sync.Mutex
	keys []string
	path []string
}

func (f *fakeAPI) serve(t *testing.T, tp *topology) {
	var ln net.Listener
	must(t, InNetNS(tp.upNS, func() error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", upstreamAddr1, fakeAPIPort))
		return err
	}))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("x-api-key"))
		f.path = append(f.path, r.URL.Path)
		f.mu.Unlock()
		if r.URL.Query().Get("stream") == "1" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"output_tokens\":1}}}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","usage":{"input_tokens":10,"output_tokens":5}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func (f *fakeAPI) seen() ([]string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...), append([]string(nil), f.path...)
}

// post sends one request from inside namespace ns (a sandbox's or the
// host's) with the dummy key, returning status and body.
func post(t *testing.T, ns netns.NsHandle, rawURL string) (int, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	must(t, err)
	var status int
	var body string
	err = InNetNS(ns, func() error {
		conn, err := net.DialTimeout("tcp4", u.Host, 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		req, _ := http.NewRequest("POST", rawURL, strings.NewReader(`{"model":"m"}`))
		req.Header.Set("x-api-key", DummyKey)
		if err := req.Write(conn); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		status, body = resp.StatusCode, string(b)
		return err
	})
	must(t, err)
	return status, body
}

func envOf(a *Attachment, key string) string {
	for _, kv := range a.Env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

func nsOf(t *testing.T, a *Attachment) netns.NsHandle {
	ns, err := netns.GetFromPath(a.NetNSPath)
	must(t, err)
	t.Cleanup(func() { ns.Close() })
	return ns
}

func TestCredentialProxy(t *testing.T) {
	tp := newTopology(t)
	var api fakeAPI
	api.serve(t, tp)
	secretFile := filepath.Join(tp.dir, "anthropic.key")
	must(t, os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600))
	base, _ := url.Parse(fmt.Sprintf("http://%s:%d/", upstreamAddr1, fakeAPIPort))
	var cfg Config
	m := tp.manager(t, func(c *Config) {
		c.CredentialPort = credProxyPort
		c.Credentials = map[string]Credential{credentialName: {BaseURL: base, Header: "x-api-key", SecretFile: secretFile,
			BaseURLEnv: "ANTHROPIC_BASE_URL", KeyEnv: "ANTHROPIC_API_KEY", MaxRequests: 4}}
		cfg = *c
	})
	t.Cleanup(func() { tp.assertHostClean(t, cfg) })

	// Bad input names the field.
	for _, tc := range []struct {
		req   Request
		field string
	}{
		{Request{Policy: Policy{Mode: ModeNone}, Credentials: []string{credentialName}}, "credentials:"},
		{Request{Policy: Policy{Mode: ModeEgress}, Credentials: []string{"nope"}}, "credentials[0]:"},
	} {
		err := m.Validate(tc.req)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
			t.Fatalf("Validate(%+v) = %v, want invalid_argument naming %s", tc.req, err, tc.field)
		}
	}

	a := attach(t, m, "sb-cred-a", Request{Policy: Policy{Mode: ModeAllowlist}, Credentials: []string{credentialName}})
	b := attach(t, m, "sb-cred-b", Request{Policy: Policy{Mode: ModeEgress}, Credentials: []string{credentialName}})
	c := attach(t, m, "sb-plain", Request{Policy: Policy{Mode: ModeEgress}})
	aURL, bURL := envOf(a, "ANTHROPIC_BASE_URL"), envOf(b, "ANTHROPIC_BASE_URL")
	wantPrefix := fmt.Sprintf("http://%s:%d/%s/", a.Gateway, credProxyPort, credentialName)
	if !strings.HasPrefix(aURL, wantPrefix) || aURL == bURL || envOf(a, "ANTHROPIC_API_KEY") != DummyKey {
		t.Fatalf("env of a = %v, want ANTHROPIC_BASE_URL under %s (not b's %s) and the dummy key", a.Env, wantPrefix, bURL)
	}
	for _, kv := range append(a.Env, b.Env...) {
		if strings.Contains(kv, testSecret) {
			t.Fatalf("sandbox environment holds the secret: %s", kv)
		}
	}
	ans, bns, cns := nsOf(t, a), nsOf(t, b), nsOf(t, c)

	// The granted sandbox (in allowlist mode with nothing allowed: the
	// proxy on the gateway is all it reaches) gets through; the upstream
	// sees the real key under the upstream's path.
	if st, body := post(t, ans, aURL+"/v1/messages"); st != 200 || !strings.Contains(body, `"input_tokens":10`) {
		t.Fatalf("granted request: %d %s", st, body)
	}
	if st, body := post(t, ans, aURL+"/v1/messages?stream=1"); st != 200 || !strings.Contains(body, "message_delta") {
		t.Fatalf("granted stream: %d %s", st, body)
	}
	keys, paths := api.seen()
	if len(keys) != 2 || keys[0] != testSecret || keys[1] != testSecret || paths[0] != "/v1/messages" {
		t.Fatalf("upstream saw keys %q paths %q, want the real key twice at /v1/messages", keys, paths)
	}

	// Refused: another sandbox with a's URL (token), a sandbox without
	// the credential, the host namespace with and without the token, a's
	// own address with b's token or none.
	refusals := []struct {
		name string
		ns   netns.NsHandle
		url  string
		want string
	}{
		{"other granted sandbox with a's token", bns, aURL, "wrong or missing per-sandbox token"},
		{"sandbox without the credential", cns, aURL, "was not granted"},
		{"host namespace with the token", tp.hostNS, aURL, "is not a sandbox"},
		{"host namespace without the token", tp.hostNS, wantPrefix, "is not a sandbox"},
		{"a with b's token", ans, bURL, "wrong or missing per-sandbox token"},
		{"a without a token", ans, wantPrefix + "v1/messages", "wrong or missing per-sandbox token"},
	}
	for _, r := range refusals {
		if st, body := post(t, r.ns, r.url+"/v1/messages"); st != http.StatusForbidden || !strings.Contains(body, r.want) {
			t.Errorf("%s: %d %s, want 403 with %q", r.name, st, body, r.want)
		}
	}
	if keys, _ := api.seen(); len(keys) != 2 {
		t.Fatalf("refused requests reached the upstream: %d requests seen", len(keys))
	}

	// Spend cap: max_requests 4, two used.
	for range 2 {
		if st, body := post(t, ans, aURL+"/v1/messages"); st != 200 {
			t.Fatalf("request under the cap: %d %s", st, body)
		}
	}
	st, body := post(t, ans, aURL+"/v1/messages")
	if st != http.StatusForbidden || !strings.Contains(body, "spend cap") || !strings.Contains(body, "max_requests: 4 of 4") {
		t.Fatalf("request over the cap: %d %s", st, body)
	}
	var e struct {
		Error struct{ Type, Message string }
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != "permission_error" {
		t.Fatalf("cap error body %s is not an API error", body)
	}
	u := m.CredentialUsage("sb-cred-a")[credentialName]
	want := CredentialUsage{Requests: 4, InputTokens: 10 + 100 + 10 + 10, OutputTokens: 5 + 40 + 5 + 5, Refused: 1, CapReached: "max_requests"}
	if u != want {
		t.Fatalf("usage = %+v, want %+v", u, want)
	}
	if ub := m.CredentialUsage("sb-cred-b")[credentialName]; ub.Requests != 0 {
		t.Fatalf("b's usage = %+v, want nothing forwarded", ub)
	}

	// Revoked with the ledger's releaser: refused at once.
	must(t, m.ReleaseCredential("sb-cred-b"))
	if st, _ := post(t, bns, bURL+"/v1/messages"); st != http.StatusForbidden {
		t.Fatalf("revoked credential: %d, want 403", st)
	}
}
