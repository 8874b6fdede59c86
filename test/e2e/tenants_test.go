package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// tenantClient speaks REST and MCP over HTTP to a daemon with one key.
type tenantClient struct {
	t    *testing.T
	base string
	key  string
	http *http.Client
	// session is the MCP session id once initialized.
	session string
	rpcID   int
}

// newTenantClient returns a client that sends key from source address
// local ("" for the system's choice): the daemon limits failures per
// source, and 127.0.0.0/8 gives a test as many loopback sources as it asks.
func newTenantClient(t *testing.T, d *testenv.Daemon, key, local string) *tenantClient {
	tr := &http.Transport{}
	if local != "" {
		dl := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		tr.DialContext = dl.DialContext
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &tenantClient{t: t, base: "http://" + d.HTTPAddr, key: key, http: &http.Client{Timeout: 2 * time.Minute, Transport: tr}}
}

// do sends a REST request; it returns the status and the body.
func (c *tenantClient) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, r)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// apiErr is the taxonomy's error object.
type apiErr struct {
	Code, Message string
}

func errOf(b []byte) apiErr {
	var e struct {
		Error apiErr `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error
}

// wantErr checks an answer is the taxonomy's error of code; it returns
// its message.
func (c *tenantClient) wantErr(what string, status int, b []byte, code string) string {
	c.t.Helper()
	e := errOf(b)
	if e.Code != code {
		c.t.Errorf("%s: status %d, body %s; want %s", what, status, b, code)
	}
	return e.Message
}

// createSandbox creates a shell sandbox; extra are fields of the request.
func (c *tenantClient) createSandbox(extra map[string]any) (string, int, []byte) {
	c.t.Helper()
	req := map[string]any{"language": "shell"}
	for k, v := range extra {
		req[k] = v
	}
	st, b := c.do("POST", "/v1/sandboxes", req)
	var sb struct {
		ID     string `json:"sandbox_id"`
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(b, &sb)
	return sb.ID, st, b
}

// mcp sends one JSON-RPC request over streamable HTTP (answer as JSON or
// as an SSE stream) and returns the HTTP status and the result or error.
func (c *tenantClient) mcp(method string, params any) (int, map[string]any) {
	c.t.Helper()
	c.rpcID++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.rpcID, "method": method, "params": params})
	req, _ := http.NewRequest("POST", c.base+"/mcp", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("mcp %s: %v", method, err)
	}
	defer res.Body.Close()
	if s := res.Header.Get("Mcp-Session-Id"); s != "" {
		c.session = s
	}
	var msg map[string]any
	if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m map[string]any
				if json.Unmarshal([]byte(data), &m) == nil && m["id"] != nil {
					msg = m
				}
			}
		}
	} else {
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			return res.StatusCode, map[string]any{"http_body": string(body)}
		}
		_ = json.Unmarshal(body, &msg)
	}
	return res.StatusCode, msg
}

func (c *tenantClient) mcpInit() {
	c.t.Helper()
	st, m := c.mcp("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "tenants-test", "version": "1"}})
	if st != http.StatusOK || m["result"] == nil || c.session == "" {
		c.t.Fatalf("mcp initialize: %d %v (session %q)", st, m, c.session)
	}
}

// tool calls an MCP tool; it returns the structured content, or the
// error code of an isError result.
func (c *tenantClient) tool(name string, args map[string]any) (map[string]any, string) {
	c.t.Helper()
	st, m := c.mcp("tools/call", map[string]any{"name": name, "arguments": args})
	if st != http.StatusOK {
		c.t.Fatalf("tools/call %s: HTTP %d %v", name, st, m)
	}
	res, _ := m["result"].(map[string]any)
	if res == nil {
		c.t.Fatalf("tools/call %s: %v", name, m)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	if res["isError"] == true {
		// The text is "code: message" then the error object (adapter.go).
		content, _ := res["content"].([]any)
		if len(content) > 0 {
			if first, ok := content[0].(map[string]any); ok {
				code, _, _ := strings.Cut(fmt.Sprint(first["text"]), ":")
				return nil, code
			}
		}
		return nil, fmt.Sprint(res)
	}
	return sc, ""
}

// keyOf creates an API key over the unix socket and returns its id and secret.
func keyOf(t *testing.T, d *testenv.Daemon, args ...string) (id, secret string) {
	t.Helper()
	var k struct {
		ID     string `json:"key_id"`
		Secret string `json:"secret"`
		Tenant string `json:"tenant"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl(append([]string{"--json", "keys", "create"}, args...)...)), &k); err != nil || k.Secret == "" {
		t.Fatalf("keys create %v: %+v %v", args, k, err)
	}
	return k.ID, k.Secret
}

// TestTenants: two user keys and the token file's admin key through REST
// and MCP over HTTP: each tenant sees and touches only its own sandboxes
// (another's is not_found, word for word as a missing one), the admin
// sees both with their tenant; revoking a key stops it on its next
// request, its open MCP session included; bad keys are unauthenticated
// alike.
func TestTenants(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	_, aliceKey := keyOf(t, d, "alice")
	_, bobKey := keyOf(t, d, "bob", "--quota", "sandboxes=3")
	alice := newTenantClient(t, d, aliceKey, "")
	bob := newTenantClient(t, d, bobKey, "")
	admin := newTenantClient(t, d, d.Token(), "")

	a, st, b := alice.createSandbox(nil)
	if st != http.StatusCreated || !strings.Contains(string(b), `"tenant":"alice"`) {
		t.Fatalf("alice create: %d %s", st, b)
	}
	bsb, st, b := bob.createSandbox(nil)
	if st != http.StatusCreated || !strings.Contains(string(b), `"tenant":"bob"`) {
		t.Fatalf("bob create: %d %s", st, b)
	}
	// A few operations of alice's own, so that what bob meets is ownership
	// and not a broken sandbox.
	if st, b := alice.do("POST", "/v1/sandboxes/"+a+"/exec", map[string]any{"command": "echo mine > /workspace/f; cat /workspace/f"}); st != http.StatusOK || !strings.Contains(string(b), "mine") {
		t.Fatalf("alice exec: %d %s", st, b)
	}

	const missing = "sb-0123456789ab"
	_, absent := bob.do("GET", "/v1/sandboxes/"+missing, nil)
	absentMsg := strings.ReplaceAll(bob.wantErr("get missing", 404, absent, "not_found"), missing, "ID")
	for _, op := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/ID"},
		{"POST", "/v1/sandboxes/ID/exec"},
		{"GET", "/v1/sandboxes/ID/files?path=/workspace/f"},
		{"PUT", "/v1/sandboxes/ID/files?path=/workspace/g"},
		{"GET", "/v1/sandboxes/ID/files?path=/workspace&list=true"},
		{"POST", "/v1/sandboxes/ID/snapshots"},
		{"POST", "/v1/sandboxes/ID/ports"},
		{"GET", "/v1/sandboxes/ID/jobs"},
		{"POST", "/v1/sandboxes/ID/pause"},
		{"DELETE", "/v1/sandboxes/ID"},
	} {
		var body any
		switch {
		case strings.HasSuffix(op.path, "/exec"):
			body = map[string]any{"command": "echo stolen"}
		case strings.HasSuffix(op.path, "/ports"):
			body = map[string]any{"port": 8080}
		}
		var st int
		var got []byte
		if op.method == "PUT" {
			req, _ := http.NewRequest("PUT", bob.base+strings.ReplaceAll(op.path, "ID", a), strings.NewReader("stolen"))
			req.Header.Set("Authorization", "Bearer "+bobKey)
			res, err := bob.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(res.Body)
			res.Body.Close()
			st = res.StatusCode
		} else {
			st, got = bob.do(op.method, strings.ReplaceAll(op.path, "ID", a), body)
		}
		msg := bob.wantErr("bob "+op.method+" "+op.path+" of alice's", st, got, "not_found")
		if strings.HasPrefix(op.path, "/v1/sandboxes/ID") && !strings.Contains(op.path, "snapshots") && strings.ReplaceAll(msg, a, "ID") != absentMsg {
			t.Errorf("bob %s %s: message %q differs from a missing sandbox's %q", op.method, op.path, msg, absentMsg)
		}
	}
	// Still alice's and untouched.
	if st, b := alice.do("GET", "/v1/sandboxes/"+a+"/files?path=/workspace/f", nil); st != http.StatusOK || !strings.Contains(string(b), "mine") {
		t.Fatalf("alice's file after bob's attempts: %d %s", st, b)
	}
	ids := func(c *tenantClient) map[string]string {
		t.Helper()
		st, b := c.do("GET", "/v1/sandboxes", nil)
		var l struct {
			Sandboxes []struct {
				ID     string `json:"sandbox_id"`
				Tenant string `json:"tenant"`
			} `json:"sandboxes"`
		}
		if err := json.Unmarshal(b, &l); st != http.StatusOK || err != nil {
			t.Fatalf("list: %d %s", st, b)
		}
		out := map[string]string{}
		for _, s := range l.Sandboxes {
			out[s.ID] = s.Tenant
		}
		return out
	}
	if l := ids(bob); len(l) != 1 || l[bsb] != "bob" {
		t.Errorf("bob's list: %v", l)
	}
	if l := ids(alice); len(l) != 1 || l[a] != "alice" {
		t.Errorf("alice's list: %v", l)
	}
	if l := ids(admin); l[a] != "alice" || l[bsb] != "bob" {
		t.Errorf("admin's list: %v", l)
	}
	// Keys and metrics are the admin's.
	if st, b := bob.do("GET", "/v1/keys", nil); errOf(b).Code != "permission_denied" {
		t.Errorf("bob lists keys: %d %s", st, b)
	}
	if st, b := admin.do("GET", "/v1/keys", nil); st != http.StatusOK || !strings.Contains(string(b), `"name":"alice"`) || strings.Contains(string(b), aliceKey) {
		t.Errorf("admin lists keys: %d %s", st, b)
	}
	if st, b := admin.do("GET", "/metrics", nil); st != http.StatusOK || !strings.Contains(string(b), `sandboxd_tenant_sandboxes{tenant="alice"} 1`) {
		t.Errorf("per-tenant metrics: %d %.2000s", st, b)
	}

	// MCP over HTTP: the same walls.
	bob.mcpInit()
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"sandbox_get", map[string]any{"sandbox_id": a}},
		{"exec_command", map[string]any{"sandbox_id": a, "command": "echo stolen"}},
		{"file_read", map[string]any{"sandbox_id": a, "path": "/workspace/f"}},
		{"file_write", map[string]any{"sandbox_id": a, "path": "/workspace/g", "content": "x"}},
		{"sandbox_snapshot", map[string]any{"sandbox_id": a}},
		{"sandbox_expose_port", map[string]any{"sandbox_id": a, "port": 8080}},
		{"sandbox_terminate", map[string]any{"sandbox_id": a}},
	} {
		if _, code := bob.tool(tc.tool, tc.args); code != "not_found" {
			t.Errorf("mcp %s of alice's as bob: %q, want not_found", tc.tool, code)
		}
	}
	if l, code := bob.tool("sandbox_list", map[string]any{}); code != "" || strings.Contains(fmt.Sprint(l), a) || !strings.Contains(fmt.Sprint(l), bsb) {
		t.Errorf("mcp sandbox_list as bob: %v %s", l, code)
	}
	if u, code := bob.tool("quota_usage", map[string]any{}); code != "" || u["name"] != "bob" || fmt.Sprint(u["use"].(map[string]any)["sandboxes"]) != "1" || fmt.Sprint(u["quota"].(map[string]any)["sandboxes"]) != "3" {
		t.Errorf("mcp quota_usage as bob: %v %s", u, code)
	}

	// Alice's exported archive is hers: bob's download is the answer of an
	// archive that does not exist; the admin sees it with its tenant.
	st, b = alice.do("POST", "/v1/sandboxes/"+a+"/export?path=/workspace", nil)
	var art apitypes.Artifact
	if err := json.Unmarshal(b, &art); st != http.StatusOK && st != http.StatusCreated || err != nil || art.ID == "" || art.Tenant != "alice" {
		t.Fatalf("alice's export: %d %s", st, b)
	}
	const missingArt = "art-0123456789abcdef"
	st, b = bob.do("GET", "/v1/artifacts/"+missingArt, nil)
	absentArt := bob.wantErr("bob downloads a missing archive", st, b, "not_found")
	st, b = bob.do("GET", "/v1/artifacts/"+art.ID, nil)
	if msg := bob.wantErr("bob downloads alice's archive", st, b, "not_found"); st != http.StatusNotFound || strings.ReplaceAll(msg, art.ID, missingArt) != absentArt {
		t.Errorf("bob downloads alice's archive: %d %q, want the missing archive's %q", st, msg, absentArt)
	}
	for who, c := range map[string]*tenantClient{"alice": alice, "admin": admin} {
		if st, b := c.do("GET", "/v1/artifacts/"+art.ID, nil); st != http.StatusOK || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s downloads alice's archive: %d, %d bytes (want gzip)", who, st, len(b))
		}
	}
	// HEAD (how a gateway finds the node that holds an archive): the
	// owner's 200 without a body, another tenant's 404.
	if st, b := alice.do("HEAD", "/v1/artifacts/"+art.ID, nil); st != http.StatusOK || len(b) != 0 {
		t.Errorf("alice's HEAD of her archive: %d, %d bytes, want 200 and no body", st, len(b))
	}
	if st, _ := bob.do("HEAD", "/v1/artifacts/"+art.ID, nil); st != http.StatusNotFound {
		t.Errorf("bob's HEAD of alice's archive: %d, want 404", st)
	}
	// Alice's preview exposure answers her token (502: nothing listens on
	// the port, so the request passed authorization and was relayed).
	st, b = alice.do("POST", "/v1/sandboxes/"+a+"/ports", map[string]any{"port": 8080})
	var x apitypes.PortExposure
	if err := json.Unmarshal(b, &x); st >= 300 || err != nil || x.Token == "" {
		t.Fatalf("alice exposes 8080: %d %s", st, b)
	}
	preview := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", x.BaseURL+"index.html", nil)
		req.Header.Set(x.TokenHeader, token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("preview: %v", err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := preview(x.Token); st != http.StatusBadGateway {
		t.Fatalf("alice's preview before revoke: %d, want 502 (relayed, nothing listening)", st)
	}

	// Revocation: alice's open MCP session, her open terminal, her preview
	// exposure and her REST calls stop at once.
	wsCtx, wsCancel := context.WithTimeout(context.Background(), time.Minute)
	defer wsCancel()
	// Bob's terminal to alice's sandbox is refused like the rest.
	if _, res, err := websocket.Dial(wsCtx, "ws://"+d.HTTPAddr+"/v1/sandboxes/"+a+"/terminal?cmd=sh", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + bobKey}}}); err == nil || res == nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("bob's terminal to alice's sandbox: %v %v", err, res)
	}
	term, _, err := websocket.Dial(wsCtx, "ws://"+d.HTTPAddr+"/v1/sandboxes/"+a+"/terminal?cmd=sh", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + aliceKey}}})
	if err != nil {
		t.Fatalf("alice's terminal: %v", err)
	}
	defer term.CloseNow()
	if err := term.Write(wsCtx, websocket.MessageBinary, []byte("echo before-revoke\n")); err != nil {
		t.Fatal(err)
	}
	for seen := ""; !strings.Contains(seen, "before-revoke\r\n"); {
		_, b, err := term.Read(wsCtx)
		if err != nil {
			t.Fatalf("alice's terminal before revoke: %v (%q)", err, seen)
		}
		seen += string(b)
	}
	alice.mcpInit()
	if _, code := alice.tool("sandbox_get", map[string]any{"sandbox_id": a}); code != "" {
		t.Fatalf("alice sandbox_get before revoke: %s", code)
	}
	var aliceID string
	for _, line := range strings.Split(d.MustCtl("keys", "list"), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "alice" {
			aliceID = f[0]
		}
	}
	d.MustCtl("keys", "revoke", aliceID)
	if st, m := alice.mcp("tools/call", map[string]any{"name": "sandbox_get", "arguments": map[string]any{"sandbox_id": a}}); st != http.StatusUnauthorized {
		t.Errorf("alice's MCP session after revoke: %d %v", st, m)
	}
	_ = term.Write(wsCtx, websocket.MessageBinary, []byte("echo after-revoke\n"))
	for {
		_, b, err := term.Read(wsCtx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
				t.Errorf("alice's terminal after revoke ended with %v, want close status policy violation", err)
			}
			break
		}
		if strings.Contains(string(b), "after-revoke\r\n") && !strings.Contains(string(b), "echo after-revoke") {
			t.Errorf("alice's terminal ran a command after revoke: %q", b)
		}
	}
	st, b = alice.do("GET", "/v1/sandboxes/"+a, nil)
	revokedMsg := alice.wantErr("alice after revoke", st, b, "unauthenticated")
	if st := preview(x.Token); st != http.StatusUnauthorized {
		t.Errorf("alice's preview after revoke: %d, want 401", st)
	}
	// The admin exposes the port again: a new exposure, alice's token
	// stays dead.
	st, b = admin.do("POST", "/v1/sandboxes/"+a+"/ports", map[string]any{"port": 8080})
	var y apitypes.PortExposure
	if err := json.Unmarshal(b, &y); st >= 300 || err != nil || y.Token == "" || y.Token == x.Token {
		t.Errorf("admin exposes 8080 again: %d %s (alice's token %s)", st, b, x.Token)
	}
	if st := preview(y.Token); st != http.StatusBadGateway {
		t.Errorf("admin's new exposure: %d, want 502", st)
	}
	if st := preview(x.Token); st != http.StatusUnauthorized {
		t.Errorf("alice's old token after the admin's expose: %d, want 401", st)
	}
	// The admin still reaches alice's sandbox, and ends it.
	if st, b := admin.do("DELETE", "/v1/sandboxes/"+a, nil); st != http.StatusOK {
		t.Errorf("admin terminates alice's: %d %s", st, b)
	}

	// Bad keys: malformed, unknown, revoked and expired say the same.
	_, shortKey := keyOf(t, d, "short", "--expires", "1s")
	short := newTenantClient(t, d, shortKey, "")
	deadline := time.Now().Add(30 * time.Second)
	for st, _ := short.do("GET", "/v1/sandboxes", nil); st == http.StatusOK; st, _ = short.do("GET", "/v1/sandboxes", nil) {
		if time.Now().After(deadline) {
			t.Fatal("a key of 1 s still works after 30 s")
		}
		time.Sleep(100 * time.Millisecond) // waiting for the clock, not for a goroutine
	}
	_, b = short.do("GET", "/v1/sandboxes", nil)
	msgs := map[string]string{"revoked": revokedMsg, "expired": short.wantErr("expired", 401, b, "unauthenticated")}
	for name, k := range map[string]string{"malformed": "not-a-key", "unknown": "e2b_" + strings.Repeat("0", 40), "empty": ""} {
		st, b := newTenantClient(t, d, k, "").do("GET", "/v1/sandboxes", nil)
		msgs[name] = bob.wantErr(name+" key", st, b, "unauthenticated")
	}
	for name, m := range msgs {
		if m != revokedMsg {
			t.Errorf("%s key: %q, revoked key: %q; want one message", name, m, revokedMsg)
		}
	}
	if st, b := bob.do("DELETE", "/v1/sandboxes/"+bsb, nil); st != http.StatusOK {
		t.Errorf("bob terminates his own: %d %s", st, b)
	}
}

// TestTenantQuotas: each quota refuses the create that would pass it,
// names itself with its value and the use, and frees as sandboxes end.
func TestTenantQuotas(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	for _, tc := range []struct {
		name, quota string
		ask         map[string]any // the create that passes it, the first fitting
		msg         string
	}{
		{"q-sandboxes", "sandboxes=1", nil, "quota sandboxes: key q-sandboxes may hold 1 live sandboxes and holds 1"},
		{"q-memory", "memory=384M", map[string]any{"memory_mb": 256}, "quota memory_mb: key q-memory may hold 384 MiB and holds 256 MiB"},
		{"q-cpus", "cpus=1", map[string]any{"cpus": 0.75}, "quota cpus: key q-cpus may hold 1 CPUs and holds 0.75"},
		{"q-disk", "disk=1G", map[string]any{"disk_mb": 768}, "quota disk_mb: key q-disk may hold 1024 MiB of disk and holds 768 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, k := keyOf(t, d, tc.name, "--quota", tc.quota)
			c := newTenantClient(t, d, k, "")
			first, st, b := c.createSandbox(tc.ask)
			if st != http.StatusCreated {
				t.Fatalf("first create: %d %s", st, b)
			}
			_, st, b = c.createSandbox(tc.ask)
			if msg := c.wantErr("second create", st, b, "limit_exceeded"); !strings.Contains(msg, tc.msg) {
				t.Errorf("refusal %q does not say %q", msg, tc.msg)
			}
			if st != http.StatusTooManyRequests {
				t.Errorf("refusal status %d", st)
			}
			if st, b := c.do("DELETE", "/v1/sandboxes/"+first, nil); st != http.StatusOK {
				t.Fatalf("terminate: %d %s", st, b)
			}
			second, st, b := c.createSandbox(tc.ask)
			if st != http.StatusCreated {
				t.Fatalf("create after the first ended: %d %s", st, b)
			}
			c.do("DELETE", "/v1/sandboxes/"+second, nil)
		})
	}
	t.Run("creates", func(t *testing.T) {
		_, k := keyOf(t, d, "q-rate", "--quota", "creates=2")
		c := newTenantClient(t, d, k, "")
		for i := 0; i < 2; i++ {
			id, st, b := c.createSandbox(nil)
			if st != http.StatusCreated {
				t.Fatalf("create %d: %d %s", i, st, b)
			}
			c.do("DELETE", "/v1/sandboxes/"+id, nil)
		}
		_, st, b := c.createSandbox(nil)
		if msg := c.wantErr("third create in a minute", st, b, "limit_exceeded"); !strings.Contains(msg, "quota creates_per_minute: key q-rate may create 2 sandboxes a minute") {
			t.Errorf("rate refusal %q", msg)
		}
		var u struct {
			Use struct {
				Sandboxes int `json:"sandboxes"`
				Creates   int `json:"creates_last_minute"`
			} `json:"use"`
		}
		if err := json.Unmarshal([]byte(d.MustCtl("--json", "keys", "usage", keyIDByName(t, d, "q-rate"))), &u); err != nil || u.Use.Creates != 2 || u.Use.Sandboxes != 0 {
			t.Errorf("keys usage: %+v %v", u, err)
		}
	})
}

func keyIDByName(t *testing.T, d *testenv.Daemon, name string) string {
	t.Helper()
	var keys []struct {
		ID   string `json:"key_id"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("--json", "keys", "list")), &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Name == name {
			return k.ID
		}
	}
	t.Fatalf("no key %s", name)
	return ""
}

// TestAuthFailureFlood: 10,000 wrong keys from one source are refused,
// soon without being looked at, and do not slow another source's calls.
func TestAuthFailureFlood(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	_, k := keyOf(t, d, "victim")
	victim := newTenantClient(t, d, k, "127.0.0.1")
	latency := func(n int) time.Duration {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			start := time.Now()
			if st, b := victim.do("GET", "/v1/sandboxes", nil); st != http.StatusOK {
				t.Fatalf("victim: %d %s", st, b)
			}
			ds = append(ds, time.Since(start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	before := latency(50)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		codes    = map[int]int{}
		attacker = newTenantClient(t, d, "", "127.0.0.2")
	)
	attacker.http.Transport.(*http.Transport).MaxIdleConnsPerHost = 8
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 10000/8; i++ {
				req, _ := http.NewRequest("GET", attacker.base+"/v1/sandboxes", nil)
				req.Header.Set("Authorization", fmt.Sprintf("Bearer e2b_%040x", w*100000+i))
				res, err := attacker.http.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				mu.Lock()
				codes[res.StatusCode]++
				mu.Unlock()
			}
		}(w)
	}
	during := latency(50)
	wg.Wait()
	t.Logf("victim's median GET: %v before, %v during the flood; attacker's answers: %v", before, during, codes)
	if codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] < 9000 || codes[http.StatusTooManyRequests] < 9000 || codes[http.StatusOK] != 0 {
		t.Errorf("attacker's answers: %v (want nearly all 429 after the first few 401)", codes)
	}
	// Two shared cores: the bound is loose, a slowed daemon misses it by far.
	if limit := max(10*before, 50*time.Millisecond); during > limit {
		t.Errorf("the flood slowed another source: median %v during, %v before (limit %v)", during, before, limit)
	}
	if st, b := victim.do("GET", "/v1/sandboxes", nil); st != http.StatusOK {
		t.Errorf("victim after the flood: %d %s", st, b)
	}
}
