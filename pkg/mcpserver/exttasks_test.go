package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// blockingEngine is the fake engine whose RunCode of "block" runs until its
// context ends, and says so on stopped.
type blockingEngine struct {
	*fakeEngine
	stopped chan struct{}
}

func (b *blockingEngine) RunCode(ctx context.Context, req apitypes.RunCodeRequest, out sandbox.OutputFunc) (*apitypes.RunResult, error) {
	if req.Code != "block" {
		return &apitypes.RunResult{Success: true, Stdout: "42\n", Language: "python"}, nil
	}
	<-ctx.Done()
	b.stopped <- struct{}{}
	return nil, ctx.Err()
}

// extHarness posts raw JSON-RPC to the MCP handler as a 2026-07-28 client,
// the caller's API key id in X-Test-Key (the daemon's bearer check attaches
// the principal the same way, before /mcp).
type extHarness struct {
	t   *testing.T
	url string
	n   int
}

func newExtHarness(t *testing.T, e Engine, opt Options) *extHarness {
	opt.Log = testenv.Logger(t)
	h := NewHandler(e, opt)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := principal.With(r.Context(), principal.Principal{KeyID: r.Header.Get("X-Test-Key"), Tenant: r.Header.Get("X-Test-Key")})
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(ts.Close)
	return &extHarness{t: t, url: ts.URL}
}

// rpc sends method with params framed as a 2026-07-28 request (declaring
// the extension when declare), as key, and returns the HTTP status and
// the response's result or error.
func (h *extHarness) rpc(key, method string, params map[string]any, declare bool, headers ...string) (int, map[string]any, *rpcErr) {
	h.t.Helper()
	caps := map[string]any{}
	if declare {
		caps["extensions"] = map[string]any{extTasksID: map[string]any{}}
	}
	params["_meta"] = map[string]any{
		mcp.MetaKeyProtocolVersion:           "2026-07-28",
		"io.modelcontextprotocol/clientInfo": map[string]any{"name": "t", "version": "1"},
		metaClientCapabilities:               caps,
	}
	h.n++
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": h.n, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, h.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("X-Test-Key", key)
	req.Header.Set(mcp.HeaderProtocolVersion, "2026-07-28")
	req.Header.Set(mcp.HeaderMethod, method)
	if name, ok := headerName(method, mustJSON(params)); ok {
		if enc, ok := mcp.EncodeHeaderValue(name); ok {
			req.Header.Set(mcp.HeaderName, enc)
		}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var last []byte
		for _, line := range bytes.Split(data, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				last = d
			}
		}
		data = last
	}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  *rpcErr        `json:"error"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		h.t.Fatalf("%s: %d %q: %v", method, resp.StatusCode, data, err)
	}
	return resp.StatusCode, msg.Result, msg.Error
}

type rpcErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Error struct{ Code, Message string } `json:"error"`
	} `json:"data"`
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// status polls tasks/get until the task's status is want (or the task is
// gone, for want ""), for at most 5 s.
func (h *extHarness) status(key, id, want string) (map[string]any, *rpcErr) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, res, e := h.rpc(key, "tasks/get", map[string]any{"taskId": id}, true)
		if (want == "" && e != nil) || (res != nil && res["status"] == want) || time.Now().After(deadline) {
			return res, e
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExtTasksServer: the 2026-07-28 tasks extension on the handler, with
// the fake engine. A declaring call of run_code is a task that completes
// with the tool's result (resultType complete inside); another key gets
// not_found for it, as for an id that never existed; the per-key bound
// refuses a third running task with limit_exceeded and makes room by
// dropping a finished one; tasks/cancel stops the work; at its TTL a task
// is gone and its work stopped; a mismatched Mcp-Name is refused; calls
// that do not declare the extension, and calls that answer at once anyway,
// get the plain result.
func TestExtTasksServer(t *testing.T) {
	eng := &blockingEngine{fakeEngine: newFake(), stopped: make(chan struct{}, 8)}
	h := newExtHarness(t, eng, Options{TaskTTL: 2 * time.Second, MaxTasksPerKey: 2})
	call := func(key, code string, declare bool) map[string]any {
		t.Helper()
		_, res, e := h.rpc(key, "tools/call", map[string]any{"name": "run_code", "arguments": map[string]any{"language": "python", "code": code}}, declare)
		if e != nil {
			t.Fatalf("tools/call: %+v", e)
		}
		return res
	}

	// A short call: a task, completed with the tool's result.
	handle := call("a", "print(6*7)", true)
	id, _ := handle["taskId"].(string)
	if handle["resultType"] != "task" || !strings.HasPrefix(id, extTaskIDPrefix) || handle["ttlMs"] != 2000.0 || handle["pollIntervalMs"] != 1000.0 {
		t.Fatalf("task handle: %v", handle)
	}
	res, e := h.status("a", id, "completed")
	result, _ := res["result"].(map[string]any)
	sc, _ := result["structuredContent"].(map[string]any)
	if e != nil || res["resultType"] != "complete" || result["resultType"] != "complete" || sc["stdout"] != "42\n" {
		t.Fatalf("completed task: %v %+v", res, e)
	}

	// Another key: not found, word for word as a missing id.
	_, _, foreign := h.rpc("b", "tasks/get", map[string]any{"taskId": id}, true)
	_, _, missing := h.rpc("b", "tasks/get", map[string]any{"taskId": extTaskIDPrefix + "nope"}, true)
	if foreign == nil || foreign.Code != mcp.INVALID_PARAMS || foreign.Data.Error.Code != "not_found" ||
		missing == nil || strings.ReplaceAll(missing.Message, extTaskIDPrefix+"nope", id) != foreign.Message {
		t.Errorf("another key's tasks/get: %+v; a missing id's: %+v", foreign, missing)
	}
	if _, _, e := h.rpc("b", "tasks/cancel", map[string]any{"taskId": id}, true); e == nil || e.Data.Error.Code != "not_found" {
		t.Errorf("another key's tasks/cancel: %+v", e)
	}

	// The bound: key a holds the finished task and one running; a second
	// running one drops the finished; a third is refused.
	run1, _ := call("a", "block", true)["taskId"].(string)
	run2, _ := call("a", "block", true)["taskId"].(string)
	if run1 == "" || run2 == "" {
		t.Fatalf("running tasks: %q %q", run1, run2)
	}
	if _, e := h.status("a", id, ""); e == nil || e.Data.Error.Code != "not_found" {
		t.Errorf("the finished task was not dropped for room: %+v", e)
	}
	refused := call("a", "block", true)
	content, _ := refused["content"].([]any)
	text := fmt.Sprint(content)
	if refused["isError"] != true || refused["resultType"] != "complete" || !strings.Contains(text, "limit_exceeded: tasks:") {
		t.Errorf("a third running task: %v", refused)
	}
	if other := call("b", "block", true); other["resultType"] != "task" {
		t.Errorf("another key's bound is its own: %v", other)
	}

	// tasks/cancel: acknowledged, cancelled, the work stopped.
	if _, res, e := h.rpc("a", "tasks/cancel", map[string]any{"taskId": run1}, true); e != nil || res["resultType"] != "complete" {
		t.Fatalf("tasks/cancel: %v %+v", res, e)
	}
	if res, _ := h.status("a", run1, "cancelled"); res["status"] != "cancelled" {
		t.Errorf("after tasks/cancel: %v", res)
	}
	select {
	case <-eng.stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("tasks/cancel did not stop the work")
	}

	// The TTL: run2 (and b's) gone, their work stopped.
	if _, e := h.status("a", run2, ""); e == nil || e.Data.Error.Code != "not_found" {
		t.Errorf("past its TTL: %+v", e)
	}
	for range 2 {
		select {
		case <-eng.stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("the TTL did not stop the work")
		}
	}

	// The routing header must name the task.
	if code, _, e := h.rpc("a", "tasks/get", map[string]any{"taskId": run1}, true, mcp.HeaderName, "task-other"); e == nil || e.Code != mcp.HEADER_MISMATCH || code != http.StatusBadRequest {
		t.Errorf("Mcp-Name mismatch: %d %+v", code, e)
	}

	// Not declared, or answered at once anyway: the plain result.
	if plain := call("a", "print(6*7)", false); plain["resultType"] != "complete" || plain["taskId"] != nil || plain["structuredContent"] == nil {
		t.Errorf("without the extension: %v", plain)
	}
	for name, args := range map[string]map[string]any{
		"exec_command":   {"sandbox_id": "sb-1", "command": "sleep 1", "background": true},
		"sandbox_create": {"language": "python"},
		"sandbox_list":   {},
	} {
		_, res, e := h.rpc("a", "tools/call", map[string]any{"name": name, "arguments": args}, true)
		if e != nil || res["resultType"] != "complete" || res["taskId"] != nil {
			t.Errorf("%s: %v %+v, want a plain result", name, res, e)
		}
	}
	if _, res, _ := h.rpc("a", "tools/call", map[string]any{"name": "sandbox_create", "arguments": map[string]any{"language": "python", "backend": "vm"}}, true); res["resultType"] != "task" {
		t.Errorf("sandbox_create of a VM: %v, want a task", res)
	}
}

// TestExtTasksRefused: malformed tasks/* requests are JSON-RPC invalid
// params with our code and a message naming the field; a 2026-07-28
// request that does not declare the extension gets -32021 naming it.
func TestExtTasksRefused(t *testing.T) {
	h := newExtHarness(t, newFake(), Options{})
	for _, tc := range []struct {
		method string
		params map[string]any
		code   string
		says   string
	}{
		{"tasks/get", map[string]any{}, "invalid_argument", "taskId: required"},
		{"tasks/get", map[string]any{"taskId": 42}, "invalid_argument", "taskId: must be a string"},
		{"tasks/get", map[string]any{"taskId": ""}, "invalid_argument", "taskId: must not be empty"},
		{"tasks/get", map[string]any{"taskId": strings.Repeat("x", 200)}, "invalid_argument", "taskId: longer than 128"},
		{"tasks/cancel", map[string]any{"taskId": "task-a b"}, "invalid_argument", "taskId: must be printable"},
		{"tasks/cancel", map[string]any{"taskId": "task-\u0000"}, "invalid_argument", "taskId: must be printable"},
		{"tasks/get", map[string]any{"taskId": "task-00000000-0000-4000-8000-000000000000"}, "not_found", "taskId: no task"},
		{"tasks/update", map[string]any{"taskId": "task-1"}, "invalid_argument", "inputResponses: must be an object"},
		{"tasks/update", map[string]any{"taskId": "task-1", "inputResponses": []int{1}}, "invalid_argument", "inputResponses: must be an object"},
		{"tasks/update", map[string]any{"taskId": "task-1", "inputResponses": map[string]any{}}, "not_found", "taskId: no task"},
	} {
		code, res, e := h.rpc("a", tc.method, tc.params, true)
		if e == nil || e.Code != mcp.INVALID_PARAMS || code != http.StatusBadRequest || e.Data.Error.Code != tc.code || !strings.Contains(e.Message, tc.says) ||
			!strings.HasPrefix(e.Message, tc.code+": ") {
			t.Errorf("%s %v: %d %v %+v, want -32602 %s saying %q", tc.method, tc.params, code, res, e, tc.code, tc.says)
		}
	}
	code, _, e := h.rpc("a", "tasks/get", map[string]any{"taskId": "task-1"}, false)
	if e == nil || e.Code != mcp.MISSING_REQUIRED_CLIENT_CAPABILITY || code != http.StatusBadRequest || !strings.Contains(e.Message, extTasksID) {
		t.Errorf("undeclared tasks/get: %d %+v", code, e)
	}
}

// TestExtTaskAnswerParsing: a task's captured answer is found in a JSON
// body and in an SSE stream after heartbeats and notifications, and only
// when it answers the task's request id.
func TestExtTaskAnswerParsing(t *testing.T) {
	sse := ": still working\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n"
	for _, tc := range []struct {
		body   string
		id     string
		found  bool
		result string
	}{
		{`{"jsonrpc":"2.0","id":"a","result":{"isError":true}}`, `"a"`, true, `{"isError":true}`},
		{`{"jsonrpc":"2.0","id":"a","error":{"code":-32603,"message":"x"}}`, `"a"`, true, ``},
		{`{"jsonrpc":"2.0","id":"b","result":{}}`, `"a"`, false, ``},
		{sse, `7`, true, `{"content":[]}`},
		{sse, `8`, false, ``},
		{": still working\n\n", `7`, false, ``},
		{``, `7`, false, ``},
	} {
		resp, ok := lastResponse([]byte(tc.body), json.RawMessage(tc.id))
		if ok != tc.found || string(resp.Result) != tc.result {
			t.Errorf("lastResponse(%q, %s) = %s %v, want %s %v", tc.body, tc.id, resp.Result, ok, tc.result, tc.found)
		}
	}
}

// TestBridgeNamesTasks: the stdio bridge's Mcp-Name for the extension's
// methods is the task id; for the others mcp-go's.
func TestBridgeNamesTasks(t *testing.T) {
	for _, tc := range []struct {
		method, params, want string
		ok                   bool
	}{
		{"tasks/get", `{"taskId":"task-1"}`, "task-1", true},
		{"tasks/cancel", `{"taskId":"task-2"}`, "task-2", true},
		{"tasks/update", `{"taskId":"task-3","inputResponses":{}}`, "task-3", true},
		{"tasks/get", `{"taskId":42}`, "", false},
		{"tools/call", `{"name":"run_code"}`, "run_code", true},
		{"tools/list", `{}`, "", false},
	} {
		if got, ok := headerName(tc.method, json.RawMessage(tc.params)); got != tc.want || ok != tc.ok {
			t.Errorf("headerName(%s, %s) = %q %v, want %q %v", tc.method, tc.params, got, ok, tc.want, tc.ok)
		}
	}
}

// TestExtTasksLegacySession: the extension is of revision 2026-07-28. A
// client on an initialized 2025 session is not offered it, and a call that
// declares it in _meta anyway gets the plain result.
func TestExtTasksLegacySession(t *testing.T) {
	c := newClient(t, newFake(), Options{})
	res, err := c.Initialize(context.Background(), mcp.InitializeRequest{Params: mcp.InitializeParams{
		ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION, ClientInfo: mcp.Implementation{Name: "t", Version: "0"}}})
	if err != nil || res.Capabilities.Extensions[extTasksID] != nil || res.Capabilities.Tasks == nil {
		t.Fatalf("initialize: %+v %v, want 2025-11-25 tasks and not the extension", res, err)
	}
	meta := &mcp.Meta{AdditionalFields: map[string]any{metaClientCapabilities: map[string]any{"extensions": map[string]any{extTasksID: map[string]any{}}}}}
	out := c.call("run_code", map[string]any{"language": "python", "code": "print(6*7)"}, meta)
	if out.IsError || out.StructuredContent == nil || out.Meta != nil && out.Meta.AdditionalFields["taskId"] != nil {
		t.Errorf("a 2025 call declaring the extension: %+v, want the plain result", out)
	}
}
