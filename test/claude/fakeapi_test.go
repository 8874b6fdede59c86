package claude_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// step is one scripted model turn: a tool call, and the check of the
// tool_result Claude Code sends back for it.
type step struct {
	tool string
	// input builds the call's arguments from what earlier steps learnt.
	input func(v *vars) map[string]any
	// check looks at the tool_result's text; it returns what is wrong.
	check func(v *vars, text string) string
}

// vars is what the script learns on the way (the sandbox id).
type vars struct{ sandboxID string }

// fakeAPI is a Messages API on loopback that plays the model: on every
// request of the main conversation (the one that offers the MCP tools) it
// checks the newest tool_result against the script and answers, streamed
// as SSE, with the next tool_use, or a final text when the script is done.
// Requests for side tasks (titles, summaries) get a short text.
type fakeAPI struct {
	t      *testing.T
	script []step
	toolNS string // "mcp__sandbox__"

	mu       sync.Mutex
	v        vars
	checked  int      // tool results checked so far
	problems []string // what was wrong
	results  []string // the text of every tool result, in order
	srv      *httptest.Server
}

func newFakeAPI(t *testing.T, script []step) *fakeAPI {
	f := &fakeAPI{t: t, script: script, toolNS: "mcp__sandbox__"}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) URL() string { return f.srv.URL }

type apiRequest struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

type block struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	IsError   bool            `json:"is_error"`
	Content   json.RawMessage `json:"content"`
	Text      string          `json:"text"`
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		fmt.Fprint(w, `{"input_tokens": 100}`)
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/messages") {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	main := false
	for _, tl := range req.Tools {
		if strings.HasPrefix(tl.Name, f.toolNS) {
			main = true
		}
	}
	if !main {
		f.answer(w, req.Stream, []map[string]any{{"type": "text", "text": "ok"}}, "end_turn")
		return
	}
	// The newest user message carries the tool result of the last step.
	turn := 0 // tool_use blocks of ours in the history = steps done
	var last *block
	for _, m := range req.Messages {
		var blocks []block
		if json.Unmarshal(m.Content, &blocks) != nil {
			continue
		}
		for i := range blocks {
			b := &blocks[i]
			if m.Role == "assistant" && b.Type == "tool_use" && strings.HasPrefix(b.ID, "toolu_step") {
				turn++
			}
			if m.Role == "user" && b.Type == "tool_result" {
				last = b
			}
		}
	}
	f.mu.Lock()
	if turn > 0 && last != nil && turn > f.checked {
		f.checked = turn
		st := f.script[turn-1]
		text := resultText(last.Content)
		f.results = append(f.results, text)
		if last.ToolUseID != fmt.Sprintf("toolu_step%02d", turn) {
			f.problems = append(f.problems, fmt.Sprintf("step %d (%s): tool_result for %s", turn, st.tool, last.ToolUseID))
		} else if last.IsError {
			f.problems = append(f.problems, fmt.Sprintf("step %d (%s): is_error: %.500s", turn, st.tool, text))
		} else if p := st.check(&f.v, text); p != "" {
			f.problems = append(f.problems, fmt.Sprintf("step %d (%s): %s; result %.300q", turn, st.tool, p, text))
		}
	}
	var content []map[string]any
	stop := "tool_use"
	if turn < len(f.script) {
		st := f.script[turn]
		content = []map[string]any{{"type": "tool_use", "id": fmt.Sprintf("toolu_step%02d", turn+1),
			"name": f.toolNS + st.tool, "input": st.input(&f.v)}}
	} else {
		content = []map[string]any{{"type": "text", "text": "All steps done."}}
		stop = "end_turn"
	}
	f.mu.Unlock()
	f.answer(w, req.Stream, content, stop)
}

// resultText is the text of a tool_result's content (a string or blocks).
func resultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []block
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
	}
	return b.String()
}

// answer writes an assistant message, streamed as the Messages API's SSE
// events when the request asked for a stream.
func (f *fakeAPI) answer(w http.ResponseWriter, stream bool, content []map[string]any, stop string) {
	msg := map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-fake",
		"stop_sequence": nil, "usage": map[string]any{"input_tokens": 100, "output_tokens": 10}}
	if !stream {
		msg["content"], msg["stop_reason"] = content, stop
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
	}
	msg["content"], msg["stop_reason"] = []any{}, nil
	ev("message_start", map[string]any{"type": "message_start", "message": msg})
	for i, c := range content {
		switch c["type"] {
		case "text":
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": c["text"]}})
		case "tool_use":
			in, _ := json.Marshal(c["input"])
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": c["id"], "name": c["name"], "input": map[string]any{}}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		}
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}})
	ev("message_stop", map[string]any{"type": "message_stop"})
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

// report is what the model saw: problems and the number of checked steps.
func (f *fakeAPI) report() (checked int, problems, results []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checked, append([]string(nil), f.problems...), append([]string(nil), f.results...)
}
