package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// serveMore answers the fake node's exposures, artifacts and SSH keys,
// as pkg/api does: the caller's tenant sees its own only.
func (n *node) serveMore(w http.ResponseWriter, r *http.Request, sbID, rest, tenant string) bool {
	path := r.URL.Path
	switch {
	case r.Method == "POST" && rest == "ports":
		base := "http://10.9.9.9:7001/preview/" + sbID + "/8000/"
		writeJSON(w, 200, apitypes.PortExposure{SandboxID: sbID, Port: 8000, URL: base + "?sandboxd_preview_token=tok", BaseURL: base,
			HostURL: "http://p8000-" + sbID + ".localhost:7001/?sandboxd_preview_token=tok", Token: "tok", TokenHeader: "X-Sandboxd-Preview-Token"})
	case (r.Method == "GET" || r.Method == "HEAD") && strings.HasPrefix(path, "/v1/artifacts/"):
		id := strings.TrimPrefix(path, "/v1/artifacts/")
		if owner, ok := n.artifacts[id]; !ok || (tenant != "admin" && owner != tenant) {
			writeErr(w, 404, "not_found", fmt.Sprintf("artifact_id: no artifact %q", id))
			return true
		}
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = io.WriteString(w, "archive of "+id+" on "+n.name)
	case r.Method == "GET" && path == "/v1/ssh/keys":
		l := apitypes.SSHKeyList{Keys: []apitypes.SSHKey{}}
		for _, k := range n.sshKeys {
			if tenant == "admin" || k.Tenant == tenant {
				l.Keys = append(l.Keys, k)
			}
		}
		writeJSON(w, 200, l)
	case r.Method == "POST" && path == "/v1/ssh/keys":
		var req apitypes.SSHKeyAddRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !strings.HasPrefix(req.PublicKey, "ssh-ed25519 ") {
			writeErr(w, 400, "invalid_argument", "public_key: not an OpenSSH public key")
			return true
		}
		// A fingerprint has '/' in it, as base64 does: removal must
		// escape it.
		fp := "SHA256:" + strings.ReplaceAll(strings.Fields(req.PublicKey)[1], "-", "/")
		for _, k := range n.sshKeys {
			if k.Fingerprint == fp {
				writeErr(w, 409, "conflict", "public_key: already registered")
				return true
			}
		}
		n.seq++
		k := apitypes.SSHKey{ID: fmt.Sprintf("key-%s-%d", n.name, n.seq), Name: req.Name, Type: "ssh-ed25519", Fingerprint: fp, Tenant: tenant, CreatedAt: time.Now()}
		n.sshKeys = append(n.sshKeys, k)
		writeJSON(w, 201, k)
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.EscapedPath(), "/v1/ssh/keys/"):
		key, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/v1/ssh/keys/"))
		if err != nil {
			writeErr(w, 400, "invalid_argument", "key: malformed")
			return true
		}
		for i, k := range n.sshKeys {
			if (k.ID == key || k.Fingerprint == key) && (tenant == "admin" || k.Tenant == tenant) {
				n.sshKeys = append(n.sshKeys[:i], n.sshKeys[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return true
			}
		}
		writeErr(w, 404, "not_found", fmt.Sprintf("id: no ssh key %q", key))
	default:
		return false
	}
	return true
}

// memFleet counts reservations as pkg/store/pgstore does, in memory.
type memFleet struct {
	mu   sync.Mutex
	seq  int
	rows map[string][2]string // reservation: key, sandbox
}

func (m *memFleet) ReserveSandbox(_ context.Context, key string, _ apitypes.KeyUse, q apitypes.Quota) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.rows {
		if r[0] == key {
			n++
		}
	}
	if q.Sandboxes > 0 && n+1 > q.Sandboxes {
		return "", errdefs.LimitExceededf("quota sandboxes: key %s may hold %d live sandboxes across the fleet and holds %d", key, q.Sandboxes, n)
	}
	m.seq++
	id := fmt.Sprint("rsv-", m.seq)
	m.rows[id] = [2]string{key, ""}
	return id, nil
}

func (m *memFleet) BindSandbox(_ context.Context, rsv, id, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[rsv]
	if !ok {
		return errdefs.NotFoundf("reservation: %s", rsv)
	}
	m.rows[rsv] = [2]string{r[0], id}
	return nil
}

func (m *memFleet) ReleaseReservation(_ context.Context, rsv string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rows, rsv)
	return nil
}

func (m *memFleet) ReleaseSandbox(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.rows {
		if r[1] == id {
			delete(m.rows, k)
		}
	}
	return nil
}

func (m *memFleet) bound(key string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.rows {
		if r[0] == key {
			out = append(out, r[1])
		}
	}
	return out
}

func (m *memFleet) Now(context.Context) (time.Time, error) { return time.Now(), nil }
func (m *memFleet) ReconcileNode(context.Context, string, time.Time, []string) (int, error) {
	return 0, nil
}
func (m *memFleet) ReleaseStale(context.Context, time.Duration) (int, error) { return 0, nil }
func (m *memFleet) ReleaseNode(context.Context, string) (int, error)         { return 0, nil }
func (m *memFleet) UseLogin(context.Context, string, time.Time) (bool, error) {
	return true, nil
}
func (m *memFleet) Usage(_ context.Context, key string) (apitypes.KeyUse, error) {
	return apitypes.KeyUse{Sandboxes: len(m.bound(key))}, nil
}
func (m *memFleet) AppendAudit(_ context.Context, rec audit.Record) (audit.Record, error) {
	return rec, nil
}
func (m *memFleet) VerifyAudit(context.Context) (*apitypes.AuditReport, error) {
	return &apitypes.AuditReport{OK: true}, nil
}

// aliceKeys knows alice's key, with a quota of 3 sandboxes.
type aliceKeys struct{}

func (aliceKeys) Key(id string) (apitypes.Key, bool) {
	if id != alice.KeyID {
		return apitypes.Key{}, false
	}
	return apitypes.Key{ID: id, Name: alice.KeyName, Tenant: alice.Tenant, Quota: apitypes.Quota{Sandboxes: 3}}, true
}

// quotaFleet is fleet with a fleet store and alice's key.
func quotaFleet(t *testing.T) (*Engine, *gateway.Gateway, []*node, *memFleet) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	f := &memFleet{rows: map[string][2]string{}}
	g := gateway.New(gateway.Options{
		Discovery: gateway.Static{{Name: a.name, URL: a.srv.URL}, {Name: b.name, URL: b.srv.URL}},
		Auth:      keyAuth{}, Secret: secret, NodeTimeout: 2 * time.Second,
		Fleet: f, Keys: aliceKeys{},
	})
	return New(g, config.Default()), g, []*node{a, b}, f
}

// quota_usage through the gateway is the fleet's count, as GET
// /v1/keys/{id}/usage on it: a fork from a snapshot is counted as a placed
// create is, and the quota refuses the one past it, wherever its snapshot
// lives. Another key's usage is not_found for a user.
func TestQuotaUsageIsTheFleets(t *testing.T) {
	e, g, nodes, f := quotaFleet(t)
	ctx := asAlice()
	nodes[1].mu.Lock()
	nodes[1].snapshots["snap-b"] = true
	nodes[1].mu.Unlock()
	sb, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	fork, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell", FromSnapshot: "snap-b"})
	if err != nil {
		t.Fatal(err)
	}
	if tag, _ := sandbox.IDNodeTag(fork.ID); tag != sandbox.NodeTag("node-b") {
		t.Errorf("a fork of node-b's snapshot landed on tag %s", tag)
	}
	u, err := e.KeyUsage(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if u.KeyID != alice.KeyID || u.Tenant != "alice" || u.Quota.Sandboxes != 3 || u.Use.Sandboxes != 2 {
		t.Errorf("quota_usage through the gateway: %+v, want alice's quota 3 and 2 sandboxes used", u)
	}
	if got := strings.Join(f.bound(alice.KeyID), " "); !strings.Contains(got, sb.ID) || !strings.Contains(got, fork.ID) {
		t.Errorf("the fleet counts %q, want %s and the fork %s", got, sb.ID, fork.ID)
	}

	// REST: a fork is found on its node and counted; the one past the
	// quota is refused before any node makes it.
	gs := httptest.NewServer(g)
	t.Cleanup(gs.Close)
	post := func(body string) (int, apitypes.Sandbox, string) {
		req, _ := http.NewRequest("POST", gs.URL+"/v1/sandboxes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var sb apitypes.Sandbox
		_ = json.Unmarshal(b, &sb)
		return res.StatusCode, sb, string(b)
	}
	code, restFork, body := post(`{"language":"shell","from_snapshot":"snap-b"}`)
	if code != 201 {
		t.Fatalf("REST fork through the gateway: %d %s", code, body)
	}
	if tag, _ := sandbox.IDNodeTag(restFork.ID); tag != sandbox.NodeTag("node-b") {
		t.Errorf("a REST fork of node-b's snapshot landed on tag %s", tag)
	}
	if got := strings.Join(f.bound(alice.KeyID), " "); !strings.Contains(got, restFork.ID) {
		t.Errorf("the fleet counts %q, want the REST fork %s", got, restFork.ID)
	}
	forksOnB := len(nodes[1].callsTo("POST", "/v1/sandboxes"))
	code, _, body = post(`{"language":"shell","from_snapshot":"snap-b"}`)
	if code != http.StatusTooManyRequests && code != http.StatusForbidden || !strings.Contains(body, "limit_exceeded") {
		t.Errorf("a fourth sandbox of a quota of 3, a REST fork: %d %s, want limit_exceeded", code, body)
	}
	_, err = e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell", FromSnapshot: "snap-b"})
	if errdefs.CodeOf(err) != errdefs.LimitExceeded {
		t.Errorf("a fourth sandbox of a quota of 3, an MCP fork: %v, want limit_exceeded", err)
	}
	if n := len(nodes[1].callsTo("POST", "/v1/sandboxes")); n != forksOnB {
		t.Errorf("node-b was asked %d more creates past the quota", n-forksOnB)
	}
	code, _, body = post(`{"language":"shell","from_snapshot":"snap-none"}`)
	if code != 404 || !strings.Contains(body, `snapshot_id: no snapshot \"snap-none\"`) {
		t.Errorf("a REST fork of a snapshot no node holds: %d %s, want the nodes' not_found", code, body)
	}
	if n := len(f.bound(alice.KeyID)); n != 3 {
		t.Errorf("the fleet counts %d sandboxes after refusals, want 3", n)
	}
	// Terminated through the MCP engine: released, and usage says so.
	if _, err := e.TerminateSandbox(ctx, fork.ID); err != nil {
		t.Fatal(err)
	}
	if u, err := e.KeyUsage(ctx, ""); err != nil || u.Use.Sandboxes != 2 {
		t.Errorf("quota_usage after a terminate: %+v %v, want 2", u, err)
	}
	if _, err := e.KeyUsage(ctx, "key-bob"); errdefs.CodeOf(err) != errdefs.NotFound || !strings.HasPrefix(errdefs.MessageOf(err), "key_id:") {
		t.Errorf("alice asking bob's usage: %v, want not_found naming key_id", err)
	}

	// A gateway without a keys store says so (it used to answer every
	// quota_usage unavailable).
	e2, _, _ := fleet(t)
	if _, err := e2.KeyUsage(ctx, ""); errdefs.CodeOf(err) != errdefs.Unavailable || !strings.HasPrefix(errdefs.MessageOf(err), "key_id:") {
		t.Errorf("quota_usage on a gateway with no keys store: %v, want unavailable naming key_id", err)
	}
}

// sandbox_expose_port through the gateway names the gateway's preview
// listener, as the REST answer does; without one, the node's URLs pass.
func TestExposePortNamesTheGatewaysPreview(t *testing.T) {
	e, g, nodes := fleet(t)
	ctx := asAlice()
	id := nodes[0].seed("alice", nil)
	x, err := e.ExposePort(ctx, apitypes.ExposePortRequest{SandboxID: id, Port: 8000})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(x.BaseURL, "http://10.9.9.9:7001/") {
		t.Errorf("without a preview URL: %+v, want the node's", x)
	}
	for _, tc := range []struct{ base, host string }{
		{"https://preview.example.com", ""},
		{"http://127.0.0.1:7082", "http://p8000-" + id + ".localhost:7082/?sandboxd_preview_token=tok"},
	} {
		g.SetPreviewURL(tc.base + "/")
		x, err := e.ExposePort(ctx, apitypes.ExposePortRequest{SandboxID: id, Port: 8000})
		if err != nil {
			t.Fatal(err)
		}
		if x.BaseURL != tc.base+"/preview/"+id+"/8000/" || x.URL != x.BaseURL+"?sandboxd_preview_token=tok" || x.HostURL != tc.host ||
			x.Token != "tok" || x.Port != 8000 || x.SandboxID != id || x.TokenHeader != "X-Sandboxd-Preview-Token" {
			t.Errorf("sandbox_expose_port through a gateway at %s: %+v", tc.base, x)
		}
	}
}

// gwDo is one REST request to the gateway as alice.
func gwDo(t *testing.T, gs *httptest.Server, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, gs.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer alice-key")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// An artifact's download through a gateway reaches the node that holds it,
// whichever node discovery lists first; another tenant's, or one no node
// holds, is not_found; a malformed id is refused naming it.
func TestArtifactsRouteToTheirNode(t *testing.T) {
	_, g, nodes := fleet(t)
	gs := httptest.NewServer(g)
	t.Cleanup(gs.Close)
	for _, n := range nodes {
		n.mu.Lock()
		n.artifacts = map[string]string{"art-" + n.name: "alice", "art-bob-" + n.name: "bob"}
		n.mu.Unlock()
	}
	for _, n := range nodes {
		for range 3 {
			code, body := gwDo(t, gs, "GET", "/v1/artifacts/art-"+n.name, "")
			if code != 200 || body != "archive of art-"+n.name+" on "+n.name {
				t.Errorf("download of %s's artifact: %d %q", n.name, code, body)
			}
		}
		if c := n.callsTo("GET", "/v1/artifacts/art-"+n.name); len(c) != 3 || c[0].p == nil || *c[0].p != alice {
			t.Errorf("%s served its artifact %d times as %+v, want 3 as alice", n.name, len(c), c)
		}
		code, body := gwDo(t, gs, "GET", "/v1/artifacts/art-bob-"+n.name, "")
		if code != 404 || !strings.Contains(body, "not_found") {
			t.Errorf("alice downloading bob's artifact: %d %s", code, body)
		}
	}
	if c := nodes[0].callsTo("GET", "/v1/artifacts/art-node-b"); len(c) != 0 {
		t.Errorf("node-a was asked for node-b's artifact download %d times", len(c))
	}
	code, body := gwDo(t, gs, "GET", "/v1/artifacts/art-none", "")
	if code != 404 || !strings.Contains(body, `artifact_id: no artifact \"art-none\"`) {
		t.Errorf("an artifact no node holds: %d %s", code, body)
	}
	code, body = gwDo(t, gs, "GET", "/v1/artifacts/a%20b", "")
	if code != 400 || !strings.Contains(body, "artifact_id: malformed") {
		t.Errorf("a malformed artifact id: %d %s", code, body)
	}
	nodes[1].srv.Close()
	code, body = gwDo(t, gs, "GET", "/v1/artifacts/art-node-b", "")
	if code != 503 || !strings.Contains(body, "node node-b") {
		t.Errorf("the artifact of a node that is gone: %d %s, want unavailable naming node-b", code, body)
	}
	if code, body := gwDo(t, gs, "GET", "/v1/artifacts/art-node-a", ""); code != 200 || body != "archive of art-node-a on node-a" {
		t.Errorf("node-a's artifact with node-b gone: %d %q", code, body)
	}
}

// An SSH key registered through a gateway is on every node (a login lands
// on the node of its sandbox), listed once, and removed from every node by
// the id the list showed, though each node gave it an id of its own.
func TestSSHKeysOnEveryNode(t *testing.T) {
	_, g, nodes := fleet(t)
	gs := httptest.NewServer(g)
	t.Cleanup(gs.Close)
	code, body := gwDo(t, gs, "POST", "/v1/ssh/keys", `{"name":"laptop","public_key":"ssh-ed25519 AAAA-b-c laptop"}`)
	if code != 201 {
		t.Fatalf("add through the gateway: %d %s", code, body)
	}
	var added apitypes.SSHKey
	if err := json.Unmarshal([]byte(body), &added); err != nil || added.Fingerprint != "SHA256:AAAA/b/c" {
		t.Fatalf("add answer %s: %v", body, err)
	}
	for _, n := range nodes {
		n.mu.Lock()
		keys := append([]apitypes.SSHKey(nil), n.sshKeys...)
		n.mu.Unlock()
		if len(keys) != 1 || keys[0].Fingerprint != added.Fingerprint || keys[0].Tenant != "alice" {
			t.Errorf("%s holds %+v, want alice's key", n.name, keys)
		}
	}
	code, body = gwDo(t, gs, "POST", "/v1/ssh/keys", `{"name":"bad","public_key":"not a key"}`)
	if code != 400 || !strings.Contains(body, "public_key:") {
		t.Errorf("a bad key through the gateway: %d %s, want the nodes' invalid_argument", code, body)
	}
	code, body = gwDo(t, gs, "GET", "/v1/ssh/keys", "")
	var l apitypes.SSHKeyList
	if err := json.Unmarshal([]byte(body), &l); code != 200 || err != nil || len(l.Keys) != 1 || l.Keys[0].ID != added.ID {
		t.Errorf("list through the gateway: %d %s, want the one key once", code, body)
	}
	code, body = gwDo(t, gs, "DELETE", "/v1/ssh/keys/"+added.ID, "")
	if code != 204 {
		t.Fatalf("remove through the gateway: %d %s", code, body)
	}
	for _, n := range nodes {
		n.mu.Lock()
		left := len(n.sshKeys)
		n.mu.Unlock()
		if left != 0 {
			t.Errorf("%s still holds %d keys after the removal", n.name, left)
		}
	}
	code, body = gwDo(t, gs, "DELETE", "/v1/ssh/keys/"+added.ID, "")
	if code != 404 || !strings.Contains(body, "id: no ssh key") {
		t.Errorf("a second removal: %d %s, want not_found naming id", code, body)
	}
	// A node that does not take the write: the answer names where it was
	// done and where not.
	nodes[1].srv.Close()
	code, body = gwDo(t, gs, "POST", "/v1/ssh/keys", `{"name":"laptop","public_key":"ssh-ed25519 BBBB laptop"}`)
	if code != 503 || !strings.Contains(body, "done on node node-a, not on node node-b") {
		t.Errorf("add with node-b gone: %d %s, want unavailable naming the nodes", code, body)
	}
	if code, body := gwDo(t, gs, "GET", "/v1/ssh/keys", ""); code != 200 || !strings.Contains(body, "SHA256:BBBB") {
		t.Errorf("list with node-b gone: %d %s, want node-a's keys", code, body)
	}
}

// A snapshot's REST routes through a gateway reach the node that holds it
// (its id carries no node tag); one no node holds is a node's own
// not_found, word for word.
func TestSnapshotRoutesFindTheirNode(t *testing.T) {
	_, g, nodes := fleet(t)
	gs := httptest.NewServer(g)
	t.Cleanup(gs.Close)
	nodes[1].mu.Lock()
	nodes[1].snapshots["snap-b"] = true
	nodes[1].mu.Unlock()
	for range 4 {
		code, body := gwDo(t, gs, "GET", "/v1/snapshots/snap-b", "")
		if code != 200 || !strings.Contains(body, `"snap-b"`) {
			t.Errorf("GET of node-b's snapshot through the gateway: %d %s", code, body)
		}
	}
	if c := nodes[0].callsTo("GET", "/v1/snapshots/snap-b"); len(c) != 0 {
		t.Errorf("node-a was asked for node-b's snapshot %d times", len(c))
	}
	if c := nodes[1].callsTo("GET", "/v1/snapshots/snap-b"); len(c) != 4 || c[0].p == nil || *c[0].p != alice {
		t.Errorf("node-b answered its snapshot %d times as %+v, want 4 as alice", len(c), c)
	}
	code, body := gwDo(t, gs, "DELETE", "/v1/snapshots/snap-b", "")
	if code != 204 {
		t.Errorf("DELETE of node-b's snapshot through the gateway: %d %s", code, body)
	}
	nodes[1].mu.Lock()
	left := nodes[1].snapshots["snap-b"]
	nodes[1].mu.Unlock()
	if left {
		t.Errorf("node-b still holds snap-b after its delete through the gateway")
	}
	code, body = gwDo(t, gs, "GET", "/v1/snapshots/snap-b", "")
	if code != 404 || !strings.Contains(body, `snapshot_id: no snapshot \"snap-b\"`) {
		t.Errorf("GET of a deleted snapshot: %d %s, want the node's not_found", code, body)
	}
}
