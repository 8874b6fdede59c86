package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/otlptest"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// Callers' traces: one per front end, so that each tree is checked alone.
const (
	mcpTrace, mcpParent   = "11111111111111111111111111111111", "1111111111111111"
	restTrace, restParent = "22222222222222222222222222222222", "2222222222222222"
	e2bTrace, e2bParent   = "33333333333333333333333333333333", "3333333333333333"
	metaTrace, metaParent = "44444444444444444444444444444444", "4444444444444444"
	// traceCode is run_code's program: it must not appear in any span.
	traceCode = "echo trace-secret-code-$((40+2))"
)

func tp(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// TestTraces: a daemon exporting to a real OTLP receiver (the collector's
// otlpreceiver, in this process). A run_code over MCP over HTTP sent with
// a traceparent header yields one trace — the HTTP request, the MCP tool
// call, the run and its steps, the agent's calls — each span the child of
// the one it should be; an exec over REST and an E2B create/kill give their
// own trees; a tool call's params._meta.traceparent parents its span; no
// span carries the program, the token or the key; and a path no route
// knows is named by its method only.
func TestTraces(t *testing.T) {
	testenv.RequireRoot(t)
	rcv := otlptest.Start(t)
	d, e2bAddr := auditDaemon(t, func(c *config.Config) {
		c.Telemetry.OTLPEndpoint = rcv.Endpoint
		c.Telemetry.ServiceName = "sandboxd-e2e"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := "http://" + d.HTTPAddr

	// MCP over HTTP, the caller's traceparent as a header on every request.
	mc, err := mcpclient.NewStreamableHttpClient(base+"/mcp", transport.WithHTTPHeaders(map[string]string{
		"Authorization": "Bearer " + d.Token(), "traceparent": tp(mcpTrace, mcpParent)}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "traces-test", Version: "0"}
	if _, err := mc.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	call := mcp.CallToolRequest{}
	call.Params.Name = "run_code"
	call.Params.Arguments = map[string]any{"language": "shell", "code": traceCode}
	res, err := mc.CallTool(ctx, call)
	if err != nil || res.IsError {
		t.Fatalf("run_code: %v %+v", err, res)
	}
	mc.Close()

	// REST: a sandbox, an exec in it with a traceparent, and a path no
	// route knows.
	rest := func(method, path, body, parent string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.Token())
		req.Header.Set("Content-Type", "application/json")
		if parent != "" {
			req.Header.Set("traceparent", parent)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return res.StatusCode, m
	}
	st, sb := rest("POST", "/v1/sandboxes", `{"language":"shell"}`, "")
	if st != http.StatusCreated && st != http.StatusOK {
		t.Fatalf("create: %d %v", st, sb)
	}
	id, _ := sb["sandbox_id"].(string)
	if st, m := rest("POST", "/v1/sandboxes/"+id+"/exec", `{"argv":["true"]}`, tp(restTrace, restParent)); st != http.StatusOK {
		t.Fatalf("exec: %d %v", st, m)
	}
	if st, _ := rest("GET", "/v1/no-such-route/"+id, "", tp(restTrace, restParent)); st != http.StatusNotFound {
		t.Fatalf("unknown route: %d", st)
	}

	// An MCP tool call whose params._meta carries the traceparent (no
	// header): the client's per-request context.
	mc2, err := mcpclient.NewStreamableHttpClient(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + d.Token()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mc2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := mc2.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	call = mcp.CallToolRequest{}
	call.Params.Name = "exec_command"
	call.Params.Arguments = map[string]any{"sandbox_id": id, "argv": []string{"true"}}
	call.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{"traceparent": tp(metaTrace, metaParent)}}
	if res, err := mc2.CallTool(ctx, call); err != nil || res.IsError {
		t.Fatalf("exec_command: %v %+v", err, res)
	}
	mc2.Close()

	// E2B: create and kill, with a traceparent.
	e2b := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+e2bAddr+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", auditE2BKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", tp(e2bTrace, e2bParent))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return res.StatusCode, m
	}
	st, esb := e2b("POST", "/sandboxes", `{"templateID":"shell","timeout":60}`)
	if st != http.StatusCreated {
		t.Fatalf("e2b create: %d %v", st, esb)
	}
	eid, _ := esb["sandboxID"].(string)
	if st, m := e2b("DELETE", "/sandboxes/"+eid, ""); st != http.StatusNoContent {
		t.Fatalf("e2b kill: %d %v", st, m)
	}

	// SIGTERM: the daemon drains and flushes its spans before it exits.
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	spans := rcv.Spans()
	traces := otlptest.Traces(spans)
	for _, s := range spans {
		for k, v := range s.Attrs {
			if strings.Contains(v, "trace-secret-code") || strings.Contains(v, d.Token()) || strings.Contains(v, auditE2BKey) {
				t.Fatalf("span %s attribute %s holds a secret or the program: %q", s.Name, k, v)
			}
		}
		if s.Service != "sandboxd-e2e" {
			t.Fatalf("span %s of service %q", s.Name, s.Service)
		}
	}

	// --- MCP run_code: one trace, parented all the way down.
	tr := traces[mcpTrace]
	if tr == nil {
		t.Fatalf("no span in the MCP caller's trace; received:\n%v", spans)
	}
	tree := tr.Tree()
	t.Logf("the run_code trace:\n%s", tree)
	one := func(tr *otlptest.Trace, name string) otlptest.Span {
		t.Helper()
		ss := tr.Named(name)
		if len(ss) != 1 {
			t.Fatalf("%d spans %q in trace %s, want 1:\n%s", len(ss), name, tr.ID, tr.Tree())
		}
		return ss[0]
	}
	parentIs := func(tr *otlptest.Trace, s otlptest.Span, want string) {
		t.Helper()
		p, ok := tr.Parent(s)
		if !ok || p.Name != want {
			t.Fatalf("parent of %s is %q (ok %v), want %q:\n%s", s.Name, p.Name, ok, want, tr.Tree())
		}
	}
	tool := one(tr, "mcp tools/call run_code")
	parentIs(tr, tool, "POST /mcp")
	httpSpan, _ := tr.Parent(tool)
	if httpSpan.ParentID != mcpParent || httpSpan.Kind != "Server" || httpSpan.Attrs["http.response.status_code"] != "200" {
		t.Fatalf("MCP request span %+v, want the caller's span %s as parent:\n%s", httpSpan, mcpParent, tree)
	}
	if tool.Attrs["sandboxd.key_name"] != "auth-token-file" || tool.Attrs["sandboxd.outcome"] != "success" || tool.Attrs["mcp.tool.name"] != "run_code" {
		t.Fatalf("tool span attributes %v", tool.Attrs)
	}
	run := one(tr, "run_code")
	parentIs(tr, run, "mcp tools/call run_code")
	if run.Attrs["sandboxd.language"] != "shell" || run.Attrs["sandboxd.sandbox_id"] == "" || run.Attrs["sandboxd.outcome"] != "success" {
		t.Fatalf("run_code span attributes %v", run.Attrs)
	}
	start := one(tr, "run.start")
	parentIs(tr, start, "run_code")
	create := one(tr, "sandbox.create")
	parentIs(tr, create, "run.start")
	if create.Attrs["sandboxd.sandbox_id"] != run.Attrs["sandboxd.sandbox_id"] {
		t.Fatalf("create made %q, the run ran in %q", create.Attrs["sandboxd.sandbox_id"], run.Attrs["sandboxd.sandbox_id"])
	}
	parentIs(tr, one(tr, "run.write_files"), "run_code")
	step := one(tr, "run.step run")
	parentIs(tr, step, "run_code")
	if step.Attrs["sandboxd.exit_code"] != "0" || step.Attrs["sandboxd.step"] != "run" {
		t.Fatalf("run step attributes %v", step.Attrs)
	}
	// The agent's exec: one start that follows the command to its exit on
	// its own connection (agent.Client.Run), under the step.
	var ops []string
	for _, s := range tr.Children(step.SpanID) {
		if s.Kind != "Client" || !strings.HasPrefix(s.Name, "agent ") {
			t.Fatalf("under the run step: %+v\n%s", s, tree)
		}
		ops = append(ops, s.Attrs["sandboxd.agent.op"])
	}
	slices.Sort(ops)
	if fmt.Sprint(ops) != "[start]" {
		t.Fatalf("agent calls under the run step: %v, want one start (no attach, no forget):\n%s", ops, tree)
	}
	// Every span of the trace descends from the caller's span.
	for _, s := range tr.Spans {
		root := s
		for p, ok := tr.Parent(root); ok; p, ok = tr.Parent(root) {
			root = p
		}
		if root.ParentID != mcpParent {
			t.Fatalf("span %s does not descend from the caller's span:\n%s", s.Name, tree)
		}
	}
	for id, other := range traces {
		if id != mcpTrace && (len(other.Named("run_code")) > 0 || len(other.Named("run.step run")) > 0) {
			t.Fatalf("the run's spans are split over traces: %s has\n%s", id, other.Tree())
		}
	}

	// --- REST exec.
	tr = traces[restTrace]
	if tr == nil {
		t.Fatal("no span in the REST caller's trace")
	}
	hs := one(tr, "POST /v1/sandboxes/{id}/exec")
	if hs.ParentID != restParent || hs.Attrs["sandboxd.front_end"] != "rest" || hs.Attrs["sandboxd.key_name"] != "auth-token-file" || hs.Attrs["http.response.status_code"] != "200" {
		t.Fatalf("REST exec span %+v\n%s", hs, tr.Tree())
	}
	ex := one(tr, "sandbox.exec")
	parentIs(tr, ex, "POST /v1/sandboxes/{id}/exec")
	if ex.Attrs["sandboxd.sandbox_id"] != id || ex.Attrs["sandboxd.exit_code"] != "0" {
		t.Fatalf("exec span attributes %v", ex.Attrs)
	}
	if kids := tr.Children(ex.SpanID); len(kids) != 1 || kids[0].Kind != "Client" || kids[0].Attrs["sandboxd.agent.op"] != "start" {
		t.Fatalf("agent calls under the exec: %+v, want one start:\n%s", kids, tr.Tree())
	}
	nr := one(tr, "GET (unmatched)")
	if nr.Attrs["http.response.status_code"] != "404" || strings.Contains(fmt.Sprint(nr.Attrs), "no-such-route") {
		t.Fatalf("unknown route span %+v", nr)
	}

	// --- MCP with params._meta.traceparent.
	tr = traces[metaTrace]
	if tr == nil {
		t.Fatal("no span in the _meta caller's trace")
	}
	mt := one(tr, "mcp tools/call exec_command")
	if mt.ParentID != metaParent || len(mt.Links) != 1 || mt.Attrs["sandboxd.sandbox_id"] != id {
		t.Fatalf("_meta tool span %+v\n%s", mt, tr.Tree())
	}
	parentIs(tr, one(tr, "sandbox.exec"), "mcp tools/call exec_command")

	// --- E2B create and kill.
	tr = traces[e2bTrace]
	if tr == nil {
		t.Fatal("no span in the E2B caller's trace")
	}
	ec := one(tr, "POST /sandboxes")
	if ec.ParentID != e2bParent || ec.Attrs["sandboxd.front_end"] != "e2b" || ec.Attrs["http.response.status_code"] != "201" || ec.Attrs["sandboxd.key_name"] == "" {
		t.Fatalf("E2B create span %+v\n%s", ec, tr.Tree())
	}
	parentIs(tr, one(tr, "sandbox.create"), "POST /sandboxes")
	if k := one(tr, "DELETE /sandboxes/{id}"); k.ParentID != e2bParent || strings.Contains(k.Name, eid) {
		t.Fatalf("E2B kill span %+v", k)
	}
}
