package claude_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/fakemessages"
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

type block = fakemessages.Block

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	req, ok := fakemessages.ReadRequest(w, r)
	if !ok {
		return
	}
	main := false
	for _, tl := range req.Tools {
		if strings.HasPrefix(tl.Name, f.toolNS) {
			main = true
		}
	}
	if !main {
		fakemessages.Answer(w, req.Stream, []map[string]any{{"type": "text", "text": "ok"}}, "end_turn")
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
		text := fakemessages.ResultText(last.Content)
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
	fakemessages.Answer(w, req.Stream, content, stop)
}

// report is what the model saw: problems and the number of checked steps.
func (f *fakeAPI) report() (checked int, problems, results []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checked, append([]string(nil), f.problems...), append([]string(nil), f.results...)
}
