// Package clients_test drives the real Codex CLI (npm @openai/codex) and
// Gemini CLI (npm @google/gemini-cli), pinned in package.json and installed
// by scripts/install-deps.sh, against mcp-sandboxd over stdio and HTTP. Each
// CLI talks to a fake of its model API on loopback (fakeopenai_test.go: the
// OpenAI Responses API; fakegemini_test.go: Gemini's generateContent and
// streamGenerateContent) that plays the model: it checks that our tools
// reached it with their schemas, calls them in a fixed script and checks
// what the CLI hands back as each tool's result — the output, or our
// error message.
package clients_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// step is one scripted model turn: a tool call, and the check of the
// result the client hands back for it.
type step struct {
	tool string
	// input builds the call's arguments from what earlier steps learnt.
	input func(v *vars) map[string]any
	// check looks at what the model saw; it returns what is wrong.
	check func(v *vars, seen *seen) string
}

// vars is what the script learns on the way (the sandbox id).
type vars struct{ sandboxID string }

// seen is a tool result as a client hands it to its model, in whatever
// form: text holds every string in it, docs every JSON object found in it
// or in a string of it that is a JSON document (the structured content,
// however a client wraps and quotes it).
type seen struct {
	raw     string
	text    string
	docs    []map[string]any
	isError bool // the client marked the result as failed
	// errorShown: the client's form tells a failed result apart (Gemini
	// CLI: {"error": ...} instead of {"output": ...}); Codex CLI's does not.
	errorShown bool
}

// newSeen reads v, a decoded JSON value of the model API's request.
func newSeen(v any) *seen {
	raw, _ := json.Marshal(v)
	s := &seen{raw: string(raw)}
	var b strings.Builder
	var walk func(x any, depth int)
	walk = func(x any, depth int) {
		if depth > 8 {
			return
		}
		switch x := x.(type) {
		case map[string]any:
			s.docs = append(s.docs, x)
			for _, e := range x {
				walk(e, depth+1)
			}
		case []any:
			for _, e := range x {
				walk(e, depth+1)
			}
		case string:
			b.WriteString(x)
			b.WriteByte('\n')
			// A string may be, or hold, JSON documents on lines of their
			// own (Codex: "Wall time: ...\nOutput:\n{...}"; Gemini wraps
			// each text block in <untrusted_context> lines; our error
			// text ends with the error object).
			for i := 0; i < len(x); i++ {
				if (x[i] == '{' || x[i] == '[') && (i == 0 || x[i-1] == '\n') {
					var inner any
					if json.NewDecoder(strings.NewReader(x[i:])).Decode(&inner) == nil {
						walk(inner, depth+1)
					}
				}
			}
		}
	}
	walk(v, 0)
	s.text = b.String()
	return s
}

// field finds the first JSON object with key k and returns its value.
func (s *seen) field(k string) (any, bool) {
	for _, d := range s.docs {
		if v, ok := d[k]; ok {
			return v, true
		}
	}
	return nil, false
}

// str is field k as a string ("" when absent or not a string).
func (s *seen) str(k string) string {
	v, _ := s.field(k)
	x, _ := v.(string)
	return x
}

// num is field k as a number (-1 when absent).
func (s *seen) num(k string) float64 {
	v, ok := s.field(k)
	if x, isNum := v.(float64); ok && isNum {
		return x
	}
	return -1
}

var sandboxIDRe = regexp.MustCompile(`sb-[0-9a-f]{12}`)

// bigOutput records how much of the 1 MB output each model saw.
var bigOutput sync.Map // session name -> int

// silentFor is how long the silent command sleeps: 75 s, or
// SANDBOXD_CLIENTS_SILENT_S.
func silentFor() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("SANDBOXD_CLIENTS_SILENT_S")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return 75 * time.Second
}

// script is the session every client runs over every transport: 20 tool
// calls. name keys the 1 MB figure.
func script(name string, silent time.Duration) []step {
	sb := func(extra map[string]any) func(*vars) map[string]any {
		return func(v *vars) map[string]any {
			m := map[string]any{"sandbox_id": v.sandboxID}
			for k, x := range extra {
				m[k] = x
			}
			return m
		}
	}
	fixed := func(m map[string]any) func(*vars) map[string]any { return func(*vars) map[string]any { return m } }
	out := func(stdout string, exit float64) func(*vars, *seen) string {
		return func(_ *vars, s *seen) string {
			if s.isError {
				return "marked as an error"
			}
			if got := s.str("stdout"); got != stdout {
				return fmt.Sprintf("stdout %q, want %q", got, stdout)
			}
			if exit >= 0 && s.num("exit_code") != exit {
				return fmt.Sprintf("exit_code %v, want %v", s.num("exit_code"), exit)
			}
			return ""
		}
	}
	steps := []step{
		{tool: "languages_list", input: fixed(map[string]any{}), check: func(_ *vars, s *seen) string {
			if s.isError || !strings.Contains(s.raw, "python") || !strings.Contains(s.raw, "shell") {
				return "no python and shell"
			}
			return ""
		}},
		{tool: "run_code", input: fixed(map[string]any{"language": "python", "code": "print(6*7)\n"}), check: func(_ *vars, s *seen) string {
			if got := s.str("stdout"); got != "42\n" {
				return fmt.Sprintf("stdout %q, want 42", got)
			}
			if ok, _ := s.field("success"); ok != true {
				return "success is not true"
			}
			return ""
		}},
		{tool: "sandbox_create", input: fixed(map[string]any{"language": "shell"}), check: func(v *vars, s *seen) string {
			v.sandboxID = s.str("sandbox_id")
			if !sandboxIDRe.MatchString(v.sandboxID) || s.str("state") != "ready" {
				return "no ready sandbox id"
			}
			return ""
		}},
		{tool: "exec_command", input: sb(map[string]any{"command": "echo hi; echo err >&2; exit 3"}), check: func(v *vars, s *seen) string {
			if p := out("hi\n", 3)(v, s); p != "" {
				return p
			}
			if got := s.str("stderr"); got != "err\n" {
				return fmt.Sprintf("stderr %q, want err", got)
			}
			return ""
		}},
		{tool: "file_write", input: sb(map[string]any{"path": "/workspace/hello.txt", "content": "hello from a client\n"}), check: func(_ *vars, s *seen) string {
			if s.isError || s.str("path") != "/workspace/hello.txt" || s.num("size") != float64(len("hello from a client\n")) {
				return "no path and size written"
			}
			return ""
		}},
		{tool: "file_read", input: sb(map[string]any{"path": "/workspace/hello.txt"}), check: func(_ *vars, s *seen) string {
			if got := s.str("content"); got != "hello from a client\n" {
				return fmt.Sprintf("content %q", got)
			}
			return ""
		}},
		// A bad input that the input schema cannot refuse (a client may
		// check arguments against it first: Gemini CLI does): the model
		// sees our invalid_argument message.
		{tool: "exec_command", input: sb(map[string]any{"command": "true", "argv": []any{"true"}}), check: func(_ *vars, s *seen) string {
			if !strings.Contains(s.text, "invalid_argument: command: give either command or argv, not both") {
				return "our invalid_argument message is not there"
			}
			if strings.Contains(s.text, "output schema") {
				return "the client checked the error against the output schema"
			}
			if s.errorShown && !s.isError {
				return "not shown as an error"
			}
			return ""
		}},
		{tool: "exec_command", input: sb(map[string]any{"command": fmt.Sprintf("sleep %d; echo woke", int(silent.Seconds())), "timeout_seconds": silent.Seconds() + 60}),
			check: out("woke\n", 0)},
		{tool: "exec_command", input: sb(map[string]any{"command": "echo FIRST; seq 1 200000 | head -c 1000000; echo; echo LAST"}),
			check: func(_ *vars, s *seen) string {
				o := s.str("stdout")
				if len(o) < 30<<10 || !strings.HasPrefix(o, "FIRST\n") || !strings.HasSuffix(o, "LAST\n") || !strings.Contains(o, "bytes cut here") {
					return fmt.Sprintf("1 MB output: the model sees %d bytes of stdout (%d bytes in all)", len(o), len(s.raw))
				}
				bigOutput.Store(name, len(o))
				return ""
			}},
	}
	for i := len(steps); i < 19; i++ {
		steps = append(steps, step{tool: "exec_command", input: sb(map[string]any{"command": fmt.Sprintf("echo turn %d", i+1)}),
			check: out(fmt.Sprintf("turn %d\n", i+1), 0)})
	}
	steps = append(steps, step{tool: "sandbox_terminate", input: sb(nil), check: func(_ *vars, s *seen) string {
		if s.str("state") != "terminated" {
			return "not terminated"
		}
		return ""
	}})
	return steps
}

// player plays a script as the model, whatever the API: the fakes ask it
// for the next call and hand it each result.
type player struct {
	name   string
	script []step

	mu       sync.Mutex
	v        vars
	checked  int
	problems []string
	results  []string
	tools    map[string]any // tool name -> input schema, as the model got it
}

func newPlayer(name string, silent time.Duration) *player {
	return &player{name: name, script: script(name, silent)}
}

// result checks the result of step n (1-based) once.
func (p *player) result(n int, s *seen) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n <= p.checked || n > len(p.script) {
		return
	}
	p.checked = n
	st := p.script[n-1]
	p.results = append(p.results, s.raw)
	if prob := st.check(&p.v, s); prob != "" {
		p.problems = append(p.problems, fmt.Sprintf("step %d (%s): %s; seen %.400q", n, st.tool, prob, s.raw))
	}
}

// next is the call of step n (0-based), or false when the script is done.
func (p *player) next(n int) (tool string, args map[string]any, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n >= len(p.script) {
		return "", nil, false
	}
	return p.script[n].tool, p.script[n].input(&p.v), true
}

// offered records the tools of a request (name -> input schema).
func (p *player) offered(tools map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tools == nil {
		p.tools = tools
	}
}

func (p *player) report() (checked int, problems []string, tools map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checked, append([]string(nil), p.problems...), p.tools
}
