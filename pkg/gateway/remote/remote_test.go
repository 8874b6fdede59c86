package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

const secret = "0123456789abcdef-secret"

// node is a REST node daemon as far as the engine reaches one: it checks
// the gateway's credentials as pkg/api/gateway.go does, and records who
// each call was made as.
type node struct {
	t    *testing.T
	name string
	srv  *httptest.Server

	mu        sync.Mutex
	seq       int
	sandboxes map[string]apitypes.Sandbox
	files     map[string][]byte
	snapshots map[string]bool
	templates map[string]bool
	artifacts map[string]string // artifact id: its tenant
	sshKeys   []apitypes.SSHKey
	calls     []call
}

// call is one request as the node saw it.
type call struct {
	method, path string
	p            *principal.Principal // nil: the gateway's own
	auth         string               // an Authorization header that got through
}

func newNode(t *testing.T, name string) *node {
	n := &node{t: t, name: name, sandboxes: map[string]apitypes.Sandbox{}, files: map[string][]byte{},
		snapshots: map[string]bool{}, templates: map[string]bool{}}
	n.srv = httptest.NewServer(n)
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) id(seq int) string { return fmt.Sprintf("sb-%s%012x", sandbox.NodeTag(n.name), seq) }

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (n *node) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(api.GatewaySecretHeader) != secret {
		writeErr(w, http.StatusUnauthorized, "unauthenticated", "no gateway secret")
		return
	}
	c := call{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization")}
	if h := r.Header.Get(api.GatewayPrincipalHeader); h != "" {
		c.p = &principal.Principal{}
		if err := json.Unmarshal([]byte(h), c.p); err != nil {
			writeErr(w, http.StatusBadRequest, "invalid_argument", "malformed principal")
			return
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.URL.Path != "/v1/node" {
		n.calls = append(n.calls, c)
	}
	tenant := "admin"
	if c.p != nil {
		tenant = c.p.Tenant
	}
	path := r.URL.Path
	sbID, rest, _ := strings.Cut(strings.TrimPrefix(path, "/v1/sandboxes/"), "/")
	sb, known := n.sandboxes[sbID]
	if strings.HasPrefix(path, "/v1/sandboxes/") && (!known || (c.p != nil && !c.p.Admin && sb.Tenant != tenant)) {
		writeErr(w, http.StatusNotFound, "not_found", fmt.Sprintf("sandbox_id: no sandbox %q", sbID))
		return
	}
	switch {
	case path == "/v1/node":
		writeJSON(w, 200, apitypes.NodeStatus{Name: n.name, Ready: true, Live: len(n.sandboxes), MaxSandboxes: 100, Images: []string{"shell", "python"}})
	case r.Method == "POST" && path == "/v1/sandboxes":
		var req apitypes.CreateSandboxRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, "invalid_argument", "body: "+err.Error())
			return
		}
		if req.Language == "cobol" {
			writeErr(w, 400, "invalid_argument", `language: "cobol" is not enabled on this node`)
			return
		}
		n.seq++
		sb := apitypes.Sandbox{ID: n.id(n.seq), Tenant: tenant, State: apitypes.State("ready"), Labels: req.Labels, CreatedAt: time.Now()}
		n.sandboxes[sb.ID] = sb
		writeJSON(w, 201, sb)
	case r.Method == "GET" && path == "/v1/sandboxes":
		l := apitypes.SandboxList{Sandboxes: []apitypes.Sandbox{}}
		for _, sb := range n.sandboxes {
			if tenant == "admin" || sb.Tenant == tenant {
				l.Sandboxes = append(l.Sandboxes, sb)
			}
		}
		l.Total = len(l.Sandboxes)
		writeJSON(w, 200, l)
	case r.Method == "GET" && rest == "":
		writeJSON(w, 200, sb)
	case r.Method == "DELETE" && rest == "":
		delete(n.sandboxes, sbID)
		sb.State = apitypes.State("terminated")
		writeJSON(w, 200, sb)
	case r.Method == "POST" && rest == "exec":
		var req apitypes.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		_ = enc.Encode(apitypes.ExecLine{Stream: "stdout", Data: "on " + n.name + "\n"})
		_ = enc.Encode(apitypes.ExecLine{Stream: "stderr", Data: req.Command})
		_ = enc.Encode(apitypes.ExecLine{Exit: apitypes.NewExecExit(&apitypes.ExecResult{ExitCode: 3})})
	case r.Method == "POST" && (rest == "tasks" || rest == "packages"):
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, 200, apitypes.ExecResult{ExitCode: 0, Stdout: fmt.Sprintf("%s %v %v on %s", rest, req["task"], req["packages"], n.name)})
	case r.Method == "POST" && path == "/v1/run":
		var req apitypes.RunCodeRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		enc := json.NewEncoder(w)
		if r.URL.Query().Get("stream") == "true" {
			_ = enc.Encode(apitypes.ExecLine{Stream: "stdout", Data: "ran on " + n.name})
		}
		_ = enc.Encode(apitypes.ExecLine{Result: &apitypes.RunResult{Success: true}})
	case r.Method == "PUT" && rest == "files":
		if m := r.URL.Query().Get("mode"); m != "" && m != "0755" {
			writeErr(w, 400, "invalid_argument", fmt.Sprintf("mode: %q is not octal permission bits", m))
			return
		}
		b, _ := io.ReadAll(r.Body)
		n.files[sbID+":"+r.URL.Query().Get("path")] = b
		writeJSON(w, 200, apitypes.FileResult{Path: r.URL.Query().Get("path"), Size: int64(len(b))})
	case r.Method == "GET" && rest == "files":
		b, ok := n.files[sbID+":"+r.URL.Query().Get("path")]
		if !ok {
			writeErr(w, 404, "not_found", "path: no such file")
			return
		}
		if r.URL.Query().Get("max_bytes") != fmt.Sprint(1<<20) {
			writeErr(w, 400, "invalid_argument", "test node: want max_bytes of a tool's read, got "+r.URL.Query().Get("max_bytes"))
			return
		}
		w.Header().Set("X-File-Size", fmt.Sprint(len(b)))
		w.Header().Set("X-File-Truncated", "false")
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		_, _ = w.Write(b)
	case (r.Method == "GET" || r.Method == "HEAD") && strings.HasPrefix(path, "/v1/snapshots/"):
		id := strings.TrimPrefix(path, "/v1/snapshots/")
		if !n.snapshots[id] {
			writeErr(w, 404, "not_found", fmt.Sprintf("snapshot_id: no snapshot %q", id))
			return
		}
		writeJSON(w, 200, apitypes.Snapshot{ID: id})
	case r.Method == "DELETE" && strings.HasPrefix(path, "/v1/snapshots/"):
		id := strings.TrimPrefix(path, "/v1/snapshots/")
		if !n.snapshots[id] {
			writeErr(w, 404, "not_found", fmt.Sprintf("snapshot_id: no snapshot %q", id))
			return
		}
		delete(n.snapshots, id)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == "POST" && path == "/v1/templates":
		var req apitypes.TemplateCreateRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if n.templates[req.Name] {
			writeErr(w, 409, "conflict", fmt.Sprintf("name: template %q exists", req.Name))
			return
		}
		n.templates[req.Name] = true
		writeJSON(w, 201, apitypes.Template{TemplateCreateRequest: req})
	default:
		if !n.serveMore(w, r, sbID, rest, tenant) {
			writeErr(w, 404, "not_found", "no such endpoint: "+r.Method+" "+path)
		}
	}
}

func (n *node) callsTo(method, path string) []call {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []call
	for _, c := range n.calls {
		if c.method == method && c.path == path {
			out = append(out, c)
		}
	}
	return out
}

func (n *node) seed(tenant string, labels map[string]string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	sb := apitypes.Sandbox{ID: n.id(n.seq), Tenant: tenant, State: apitypes.State("ready"), Labels: labels, CreatedAt: time.Now()}
	n.sandboxes[sb.ID] = sb
	return sb.ID
}

type keyAuth struct{}

func (keyAuth) Authenticate(secret, _ string) (principal.Principal, error) {
	if secret == "alice-key" {
		return alice, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("missing or invalid API key")
}

func (keyAuth) Valid(string) bool { return true }

var alice = principal.Principal{KeyID: "key-alice", KeyName: "alice", Tenant: "alice"}

// fleet is two fake nodes behind a gateway and the engine over it.
func fleet(t *testing.T) (*Engine, *gateway.Gateway, []*node) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	g := gateway.New(gateway.Options{
		Discovery: gateway.Static{{Name: a.name, URL: a.srv.URL}, {Name: b.name, URL: b.srv.URL}},
		Auth:      keyAuth{}, Secret: secret, NodeTimeout: 2 * time.Second,
	})
	return New(g, config.Default()), g, []*node{a, b}
}

func asAlice() context.Context { return principal.With(context.Background(), alice) }

// A create is placed on a node, and every later call about the sandbox
// reaches that node, as the caller: the principal and the gateway secret,
// never a caller's credentials.
func TestRoutesAsTheCaller(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	on := map[string]int{}
	var ids []string
	for range 4 {
		sb, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		for _, n := range nodes {
			if tag, _ := sandbox.IDNodeTag(sb.ID); tag == sandbox.NodeTag(n.name) {
				on[n.name]++
			}
		}
	}
	if on["node-a"] != 2 || on["node-b"] != 2 {
		t.Errorf("4 creates placed %v, want 2 on each node", on)
	}
	for _, id := range ids {
		var streamed bytes.Buffer
		res, err := e.Exec(ctx, apitypes.ExecRequest{SandboxID: id, Command: "echo hi"}, func(stream string, data []byte) {
			fmt.Fprintf(&streamed, "%s:%s|", stream, data)
		})
		if err != nil {
			t.Fatalf("exec in %s: %v", id, err)
		}
		owner := nodes[0]
		if tag, _ := sandbox.IDNodeTag(id); tag == sandbox.NodeTag("node-b") {
			owner = nodes[1]
		}
		if res.ExitCode != 3 || res.Stdout != "on "+owner.name+"\n" || res.Stderr != "echo hi" {
			t.Errorf("exec in %s: %+v, want exit 3 and stdout from %s", id, res, owner.name)
		}
		if want := "stdout:on " + owner.name + "\n|stderr:echo hi|"; streamed.String() != want {
			t.Errorf("streamed %q, want %q", streamed.String(), want)
		}
	}
	for _, n := range nodes {
		calls := append(n.callsTo("POST", "/v1/sandboxes"), n.callsTo("POST", "/v1/sandboxes/"+n.id(1)+"/exec")...)
		if len(calls) != 3 {
			t.Errorf("%s saw %d creates and execs of its first sandbox, want 3", n.name, len(calls))
		}
		for _, c := range calls {
			if c.p == nil || *c.p != alice {
				t.Errorf("%s: %s %s made as %+v, want alice", n.name, c.method, c.path, c.p)
			}
			if c.auth != "" {
				t.Errorf("%s: a caller's Authorization reached the node: %q", n.name, c.auth)
			}
		}
	}
	// Another tenant's sandbox: the node's refusal, word for word.
	bob := principal.With(context.Background(), principal.Principal{KeyID: "key-bob", Tenant: "bob"})
	_, err := e.Exec(bob, apitypes.ExecRequest{SandboxID: ids[0], Command: "true"}, nil)
	if errdefs.CodeOf(err) != errdefs.NotFound || errdefs.MessageOf(err) != fmt.Sprintf("sandbox_id: no sandbox %q", ids[0]) {
		t.Errorf("bob's exec in alice's sandbox: %v (%s), want the node's not_found", err, errdefs.CodeOf(err))
	}
}

// The node's error keeps its code and message; the gateway's own checks
// refuse what names no node before any node is asked.
func TestNodeErrors(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	_, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "cobol"})
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || errdefs.MessageOf(err) != `language: "cobol" is not enabled on this node` {
		t.Errorf("create of a language no node has: %v, want the node's invalid_argument", err)
	}
	for _, bad := range []string{"sb-ffffffff000000000000", "sb-123", "../../etc", ""} {
		_, err := e.GetSandbox(ctx, bad)
		if c := errdefs.CodeOf(err); c != errdefs.NotFound && c != errdefs.InvalidArgument || !strings.Contains(errdefs.MessageOf(err), "sandbox_id") {
			t.Errorf("GetSandbox(%q): %v, want not_found or invalid_argument naming sandbox_id", bad, err)
		}
	}
	id := nodes[0].seed("alice", nil)
	_, err = e.WriteFile(ctx, apitypes.FileWriteRequest{SandboxID: id, Path: "/workspace/x", Content: "x", Mode: "0999"})
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || errdefs.MessageOf(err) != `mode: "0999" is not octal permission bits` {
		t.Errorf("a bad mode: %v, want the node's invalid_argument", err)
	}
	_, err = e.WriteFile(ctx, apitypes.FileWriteRequest{SandboxID: id, Path: "/workspace/x", Content: "%%%", Encoding: "base64"})
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(errdefs.MessageOf(err), "content: invalid base64") {
		t.Errorf("bad base64: %v, want invalid_argument naming content", err)
	}
	_, err = e.ReadFile(ctx, apitypes.FileReadRequest{SandboxID: id, Path: "/workspace/x", Encoding: "rot13"})
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(errdefs.MessageOf(err), "encoding:") {
		t.Errorf("bad encoding: %v, want invalid_argument naming encoding", err)
	}
	for _, m := range []func() error{
		func() error { _, err := e.ListVolumes(ctx); return err },
		func() error {
			_, err := e.BuildDockerfile(ctx, apitypes.DockerfileBuildRequest{}, strings.NewReader(""), nil)
			return err
		},
	} {
		if err := m(); errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(errdefs.MessageOf(err), "not served through the gateway") {
			t.Errorf("a method the gateway does not serve: %v, want unavailable saying so", err)
		}
	}
}

// A node that is gone makes its sandboxes unavailable, naming the sandbox
// and the node; the other node's keep working, and creates go there.
func TestNodeDown(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	onA, onB := nodes[0].seed("alice", nil), nodes[1].seed("alice", nil)
	if l, err := e.ListSandboxes(ctx, ""); err != nil || len(l) != 2 {
		t.Fatalf("list with both nodes up: %v %v", l, err)
	}
	nodes[1].srv.Close()
	l, err := e.ListSandboxes(ctx, "")
	if err != nil || len(l) != 2 {
		t.Fatalf("list with node-b gone: %v %v", l, err)
	}
	for _, sb := range l {
		if want := map[string]apitypes.State{onA: "ready", onB: apitypes.StateUnavailable}[sb.ID]; sb.State != want {
			t.Errorf("listed %s as %q with node-b gone, want %q", sb.ID, sb.State, want)
		}
	}
	_, err = e.Exec(ctx, apitypes.ExecRequest{SandboxID: onB, Command: "true"}, nil)
	if errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(errdefs.MessageOf(err), onB) || !strings.Contains(errdefs.MessageOf(err), "node-b") {
		t.Errorf("exec on a gone node: %v, want unavailable naming %s and node-b", err, onB)
	}
	if _, err := e.Exec(ctx, apitypes.ExecRequest{SandboxID: onA, Command: "true"}, nil); err != nil {
		t.Errorf("exec on the node that answers: %v", err)
	}
	e.g.Invalidate()
	for range 3 {
		sb, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			t.Fatalf("create with node-b gone: %v", err)
		}
		if tag, _ := sandbox.IDNodeTag(sb.ID); tag != sandbox.NodeTag("node-a") {
			t.Errorf("create with node-b gone landed on tag %s", tag)
		}
	}
	// An id no answering node knows, while one does not answer: it may
	// be that one's.
	err = e.DeleteSnapshot(ctx, "snap-0001")
	if errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(errdefs.MessageOf(err), "node-b") {
		t.Errorf("delete of an unknown snapshot with node-b gone: %v, want unavailable naming node-b", err)
	}
}

// A call whose context names no caller never leaves the gateway: nothing
// goes to a node as the gateway by omission.
func TestNoCallerRefused(t *testing.T) {
	e, _, nodes := fleet(t)
	id := nodes[0].seed("alice", nil)
	_, err := e.Exec(context.Background(), apitypes.ExecRequest{SandboxID: id, Command: "true"}, nil)
	if errdefs.CodeOf(err) != errdefs.Internal {
		t.Errorf("exec without a caller: %v, want internal", err)
	}
	if c := nodes[0].callsTo("POST", "/v1/sandboxes/"+id+"/exec"); len(c) != 0 {
		t.Errorf("the node saw %d execs without a caller", len(c))
	}
}

// run_code without a sandbox is placed and streams; files round-trip in
// bytes (base64 in, base64 out for what is not UTF-8).
func TestRunAndFiles(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	var out strings.Builder
	res, err := e.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(1)"}, func(_ string, d []byte) { out.Write(d) })
	if err != nil || !res.Success || !strings.HasPrefix(out.String(), "ran on node-") {
		t.Fatalf("run_code: %+v %v, streamed %q", res, err, out.String())
	}
	id := nodes[1].seed("alice", nil)
	if r, err := e.RunTask(ctx, apitypes.RunTaskRequest{SandboxID: id, Task: "test"}); err != nil || r.Stdout != "tasks test <nil> on node-b" {
		t.Errorf("run_task: %+v %v", r, err)
	}
	if r, err := e.PackagesInstall(ctx, apitypes.PackagesInstallRequest{SandboxID: id, Manager: "pip", Packages: []string{"six"}}); err != nil || r.Stdout != "packages <nil> [six] on node-b" {
		t.Errorf("packages_install: %+v %v", r, err)
	}
	bin := []byte{0xff, 0x00, 'x'}
	if _, err := e.WriteFile(ctx, apitypes.FileWriteRequest{SandboxID: id, Path: "/workspace/b", Content: "/wB4", Encoding: "base64", Mode: "0755"}); err != nil {
		t.Fatal(err)
	}
	nodes[1].mu.Lock()
	got := nodes[1].files[id+":/workspace/b"]
	nodes[1].mu.Unlock()
	if !bytes.Equal(got, bin) {
		t.Errorf("the node holds %q, want %q", got, bin)
	}
	rd, err := e.ReadFile(ctx, apitypes.FileReadRequest{SandboxID: id, Path: "/workspace/b"})
	if err != nil || rd.Encoding != "base64" || rd.Content != "/wB4" || rd.Size != 3 || rd.Truncated {
		t.Errorf("read back: %+v %v", rd, err)
	}
}

// Session end terminates the labelled sandboxes on every node, as the
// gateway; a template goes to every node, and a partial failure says where.
func TestNodeWide(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	l := map[string]string{"mcp.session": "s1"}
	mine := []string{nodes[0].seed("alice", l), nodes[1].seed("bob", l)}
	other := nodes[1].seed("alice", map[string]string{"mcp.session": "s2"})
	done, err := e.TerminateLabeled(context.Background(), "mcp.session", "s1", "its MCP session ended")
	if err != nil || len(done) != 2 {
		t.Fatalf("TerminateLabeled: %v %v, want %v", done, err, mine)
	}
	for _, n := range nodes {
		for _, c := range n.callsTo("GET", "/v1/sandboxes") {
			if c.p != nil {
				t.Errorf("%s: the session's end listed as %+v, want the gateway", n.name, c.p)
			}
		}
	}
	if d, err := e.GetSandbox(ctx, other); err != nil || d.ID != other {
		t.Errorf("another session's sandbox: %+v %v", d, err)
	}
	for _, id := range mine {
		if _, err := e.GetSandbox(asAlice(), id); errdefs.CodeOf(err) != errdefs.NotFound {
			t.Errorf("the ended session's %s: %v, want not_found", id, err)
		}
	}

	if _, err := e.CreateTemplate(ctx, apitypes.TemplateCreateRequest{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if len(n.callsTo("POST", "/v1/templates")) != 1 {
			t.Errorf("%s did not get the template", n.name)
		}
	}
	nodes[0].mu.Lock()
	nodes[0].templates["t2"] = true
	nodes[0].mu.Unlock()
	_, err = e.CreateTemplate(ctx, apitypes.TemplateCreateRequest{Name: "t2"})
	if errdefs.CodeOf(err) != errdefs.Conflict || !strings.Contains(err.Error(), "done on node node-b, not on node node-a") {
		t.Errorf("a template one node has: %v, want conflict saying where it was made", err)
	}
	nodes[1].mu.Lock()
	nodes[1].snapshots["snap-1"] = true
	nodes[1].mu.Unlock()
	if err := e.DeleteSnapshot(ctx, "snap-1"); err != nil {
		t.Errorf("delete of node-b's snapshot: %v", err)
	}
	if err := e.DeleteSnapshot(ctx, "snap-1"); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("delete of a snapshot no node has: %v, want not_found", err)
	}
}

// A fork starts on the node that holds its snapshot, whatever placement
// would have chosen; a snapshot no node holds is the nodes' not_found.
func TestForkBesideItsSnapshot(t *testing.T) {
	e, _, nodes := fleet(t)
	ctx := asAlice()
	nodes[1].mu.Lock()
	nodes[1].snapshots["snap-b"] = true
	nodes[1].mu.Unlock()
	for range 3 {
		sb, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell", FromSnapshot: "snap-b"})
		if err != nil {
			t.Fatal(err)
		}
		if tag, _ := sandbox.IDNodeTag(sb.ID); tag != sandbox.NodeTag("node-b") {
			t.Errorf("a fork of node-b's snapshot landed on tag %s", tag)
		}
	}
	if len(nodes[0].callsTo("POST", "/v1/sandboxes")) != 0 {
		t.Errorf("node-a was asked to create a fork of a snapshot it does not hold")
	}
	_, err := e.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell", FromSnapshot: "snap-none"})
	if errdefs.CodeOf(err) != errdefs.NotFound || errdefs.MessageOf(err) != `snapshot_id: no snapshot "snap-none"` {
		t.Errorf("a fork of a snapshot no node holds: %v, want the nodes' not_found", err)
	}
}
