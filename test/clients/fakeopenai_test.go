package clients_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeResponses is the OpenAI Responses API (POST /v1/responses, streamed
// as SSE) on loopback, playing p for Codex CLI. A request that offers our
// tools is the main conversation: its newest function_call_output is the
// result of the last step, and the answer is the next step's
// function_call, or a final message.
type fakeResponses struct {
	t         *testing.T
	p         *player
	srv       *httptest.Server
	seq       atomic.Int64
	namespace string // Codex's namespace of our server's tools ("mcp__sandbox")
}

func newFakeResponses(t *testing.T, p *player, server string) *fakeResponses {
	f := &fakeResponses{t: t, p: p, namespace: "mcp__" + server}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeResponses) URL() string { return f.srv.URL + "/v1" }

func (f *fakeResponses) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
		f.t.Logf("%s: codex asked %s %s", f.p.name, r.Method, r.URL.Path)
		http.NotFound(w, r)
		return
	}
	var req struct {
		Tools []map[string]any `json:"tools"`
		Input []map[string]any `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// Codex offers an MCP server's tools as a namespace named
	// mcp__<server> holding them under their own names.
	tools := map[string]any{}
	for _, tl := range req.Tools {
		if tl["type"] != "namespace" || tl["name"] != f.namespace {
			continue
		}
		inner, _ := tl["tools"].([]any)
		for _, x := range inner {
			m, _ := x.(map[string]any)
			if name, _ := m["name"].(string); name != "" {
				tools[name] = m["parameters"]
			}
		}
	}
	if len(tools) == 0 {
		f.answer(w, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "ok"}}})
		return
	}
	f.p.offered(tools)
	turn := 0
	var last map[string]any
	for _, it := range req.Input {
		id, _ := it["call_id"].(string)
		if !strings.HasPrefix(id, "call_step") {
			continue
		}
		switch it["type"] {
		case "function_call":
			turn++
		case "function_call_output":
			last = it
		}
	}
	if last != nil && turn > 0 {
		s := newSeen(last["output"])
		if id, _ := last["call_id"].(string); id != fmt.Sprintf("call_step%02d", turn) {
			s.raw = "result of " + id + ": " + s.raw
		}
		if m, ok := last["output"].(map[string]any); ok && m["success"] == false {
			s.isError = true
		}
		f.p.result(turn, s)
	}
	tool, args, ok := f.p.next(turn)
	if !ok {
		f.answer(w, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "All steps done."}}})
		return
	}
	a, _ := json.Marshal(args)
	f.answer(w, map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", f.seq.Add(1)), "call_id": fmt.Sprintf("call_step%02d", turn+1),
		"namespace": f.namespace, "name": tool, "arguments": string(a), "status": "completed"})
}

// answer streams one output item as a whole response.
func (f *fakeResponses) answer(w http.ResponseWriter, item map[string]any) {
	id := fmt.Sprintf("resp_%d", f.seq.Add(1))
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(typ string, data map[string]any) {
		data["type"] = typ
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
	}
	ev("response.created", map[string]any{"response": map[string]any{"id": id}})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": map[string]any{"id": id, "usage": map[string]any{
		"input_tokens": 100, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 10, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 110}}})
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}
