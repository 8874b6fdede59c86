// Package fakemessages is a scripted stand-in for the Anthropic Messages
// API, for tests that drive the real Claude Code CLI without the internet:
// it plays the model, answering each request of the main conversation with
// the next tool call of a script (streamed as the API's SSE events when
// asked), and records the API key every request carried and the tool
// results the CLI sent back.
package fakemessages

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Step is one scripted model turn: a tool call.
type Step struct {
	Tool  string
	Input map[string]any
}

// Server is the fake API as an http.Handler; serve it on any listener.
type Server struct {
	// Script are the tool calls of every session, in order; after the
	// last one the model answers Final and ends its turn.
	Script []Step
	Final  string
	// MainTool names a tool only the main conversation offers (e.g.
	// "Write"): requests without it (titles, summaries) get a short text.
	MainTool string

	mu      sync.Mutex
	keys    []string
	results []string
}

// Keys returns the x-api-key of every request so far.
func (s *Server) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// Results returns the text of every tool result the client sent back.
func (s *Server) Results() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.results...)
}

// Request is the part of a Messages API request the fakes read.
type Request struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// ReadRequest answers what is not a Messages request (token counting, other
// paths, a body that does not decode) and returns the request otherwise.
func ReadRequest(w http.ResponseWriter, r *http.Request) (*Request, bool) {
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		fmt.Fprint(w, `{"input_tokens": 100}`)
		return nil, false
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/messages") {
		http.NotFound(w, r)
		return nil, false
	}
	body, _ := io.ReadAll(r.Body)
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return &req, true
}

// Block is a content block of a message as the client sends it.
type Block struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	IsError   bool            `json:"is_error"`
	Content   json.RawMessage `json:"content"`
	Text      string          `json:"text"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get("x-api-key"))
	s.mu.Unlock()
	req, ok := ReadRequest(w, r)
	if !ok {
		return
	}
	main := false
	for _, t := range req.Tools {
		main = main || t.Name == s.MainTool
	}
	if !main {
		Answer(w, req.Stream, []map[string]any{{"type": "text", "text": "ok"}}, "end_turn")
		return
	}
	// Steps done = our tool_use blocks in the history; the newest user
	// message carries the result of the last one.
	turn := 0
	var last *Block
	for _, m := range req.Messages {
		var blocks []Block
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
	if last != nil {
		s.mu.Lock()
		s.results = append(s.results, ResultText(last.Content))
		s.mu.Unlock()
	}
	if turn < len(s.Script) {
		st := s.Script[turn]
		Answer(w, req.Stream, []map[string]any{{"type": "tool_use", "id": fmt.Sprintf("toolu_step%02d", turn+1),
			"name": st.Tool, "input": st.Input}}, "tool_use")
		return
	}
	Answer(w, req.Stream, []map[string]any{{"type": "text", "text": s.Final}}, "end_turn")
}

// ResultText is the text of a tool_result's content (a string or blocks).
func ResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []Block
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
	}
	return b.String()
}

// Answer writes an assistant message with content and stop reason,
// streamed as the Messages API's SSE events when stream is set. Usage:
// 100 input and 10 output tokens per message.
func Answer(w http.ResponseWriter, stream bool, content []map[string]any, stop string) {
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
