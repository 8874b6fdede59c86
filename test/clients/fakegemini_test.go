package clients_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeGemini is Gemini's generateContent and streamGenerateContent
// (?alt=sse) on loopback, playing p for Gemini CLI. A request that offers
// our tools is the main conversation: its newest functionResponse is the
// result of the last step, and the answer is the next step's
// functionCall, or a final text. Other requests (the CLI's own checks:
// model routing, next speaker) get a JSON text that answers them all.
type fakeGemini struct {
	t     *testing.T
	p     *player
	names map[string]bool // our tool names, as the server lists them
	srv   *httptest.Server
}

func newFakeGemini(t *testing.T, p *player, names []string) *fakeGemini {
	f := &fakeGemini{t: t, p: p, names: map[string]bool{}}
	for _, n := range names {
		f.names[n] = true
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeGemini) URL() string { return f.srv.URL }

// ours is the tool a declared name stands for ("" when not ours): Gemini
// CLI declares an MCP tool as mcp_<server>_<tool>.
func (f *fakeGemini) ours(name string) string {
	if n, ok := strings.CutPrefix(name, "mcp_sandbox_"); ok && f.names[n] {
		return n
	}
	return ""
}

func (f *fakeGemini) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	stream := strings.HasSuffix(r.URL.Path, ":streamGenerateContent")
	if r.Method != http.MethodPost || (!stream && !strings.HasSuffix(r.URL.Path, ":generateContent")) {
		if strings.HasSuffix(r.URL.Path, ":countTokens") {
			_, _ = io.WriteString(w, `{"totalTokens": 100}`)
			return
		}
		f.t.Logf("%s: gemini asked %s %s", f.p.name, r.Method, r.URL.Path)
		http.NotFound(w, r)
		return
	}
	var req struct {
		Contents []struct {
			Role  string           `json:"role"`
			Parts []map[string]any `json:"parts"`
		} `json:"contents"`
		Tools []struct {
			FunctionDeclarations []map[string]any `json:"functionDeclarations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tools := map[string]any{}
	declared := "" // the name our first tool was declared under
	for _, tl := range req.Tools {
		for _, d := range tl.FunctionDeclarations {
			name, _ := d["name"].(string)
			if n := f.ours(name); n != "" {
				schema := d["parametersJsonSchema"]
				if schema == nil {
					schema = d["parameters"]
				}
				tools[n] = schema
				if declared == "" {
					declared = name
				}
			}
		}
	}
	if len(tools) == 0 {
		f.answer(w, stream, map[string]any{"text": `{"reasoning": "a fake model", "next_speaker": "user", "model_choice": "flash"}`})
		return
	}
	f.p.offered(tools)
	qualify := strings.TrimSuffix(declared, f.ours(declared)) // the prefix Gemini CLI put on our names
	turn := 0
	var last map[string]any
	for _, c := range req.Contents {
		for _, part := range c.Parts {
			if fc, ok := part["functionCall"].(map[string]any); ok && c.Role == "model" {
				if id, _ := fc["id"].(string); strings.HasPrefix(id, "step") {
					turn++
				}
			}
			if fr, ok := part["functionResponse"].(map[string]any); ok {
				last = fr
			}
		}
	}
	if last != nil && turn > 0 {
		s := newSeen(last["response"])
		if id, _ := last["id"].(string); id != "" && id != fmt.Sprintf("step%02d", turn) {
			s.raw = "result of " + id + ": " + s.raw
		}
		if resp, ok := last["response"].(map[string]any); ok {
			s.errorShown, s.isError = true, resp["error"] != nil
		}
		f.p.result(turn, s)
	}
	tool, args, ok := f.p.next(turn)
	if !ok {
		f.answer(w, stream, map[string]any{"text": "All steps done."})
		return
	}
	f.answer(w, stream, map[string]any{"functionCall": map[string]any{"id": fmt.Sprintf("step%02d", turn+1), "name": qualify + tool, "args": args}})
}

// answer sends one part as the whole response, streamed when asked.
func (f *fakeGemini) answer(w http.ResponseWriter, stream bool, part map[string]any) {
	resp := map[string]any{
		"candidates":    []any{map[string]any{"content": map[string]any{"role": "model", "parts": []any{part}}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110},
		"modelVersion":  "gemini-2.5-pro",
	}
	b, _ := json.Marshal(resp)
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: %s\n\n", b)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}
