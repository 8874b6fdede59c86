package mcp

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/fakemessages"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// agentSecret is the "real" API key: only the daemon's secret file and the
// fake upstream know it.
const agentSecret = "sk-ant-mcp-test-real-key-0123456789abcdef"

// agentTopology makes a simulated host namespace (where the daemon runs)
// and an upstream namespace behind it, joined by a veth pair with the
// host's default route pointing upstream, and serves api there on
// 198.18.0.2:8088. It returns the host namespace's name.
func agentTopology(t *testing.T, api http.Handler) string {
	t.Helper()
	tp := testenv.NewTopology(t, "sbxm")
	tp.ServeHTTP(t, testenv.UpstreamAddr+":8088", api)
	return tp.Host
}

type toolError struct {
	IsError bool   `json:"isError"`
	Text    string `json:"text"`
}

// TestAgentRun: agent_run through the real daemon, driven by the official
// MCP TypeScript SDK over HTTP, runs the real Claude Code CLI in the agent
// image against a scripted Messages API behind the daemon's credential
// proxy: progress notifications name the tool calls as they happen, the
// files come back, the transcript is in the run record (run_get and on
// disk); bad input is refused with taxonomy codes naming the field. Then
// `sandboxctl agent` runs a session over the REST stream. One topology and
// one daemon for all of it.
func TestAgentRun(t *testing.T) {
	testenv.RequireRoot(t)
	node(t)
	api := &fakemessages.Server{MainTool: "Write", Final: "Added calc.py; the test passes.", Script: []fakemessages.Step{
		{Tool: "Write", Input: map[string]any{"file_path": "/workspace/calc.py", "content": "def add(a, b):\n    return a + b\n"}},
		{Tool: "Bash", Input: map[string]any{"command": "cd /workspace && python3 -m pytest -q test_calc.py", "description": "Run the tests"}},
	}}
	hostNS := agentTopology(t, api)

	d := testenv.NewDaemon(t, "agent")
	secretFile := filepath.Join(t.TempDir(), "anthropic.key")
	if err := os.WriteFile(secretFile, []byte(agentSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Config.Network.DNS = []string{"198.18.0.2"}
	d.Config.Sandbox.Memory = 1 << 30 // Claude Code's runtime
	d.Config.Sandbox.Disk = 256 << 20
	d.Config.Network.Credentials = map[string]config.Credential{"anthropic": {
		BaseURL: "http://198.18.0.2:8088", Header: "x-api-key", SecretFile: secretFile,
		BaseURLEnv: "ANTHROPIC_BASE_URL", KeyEnv: "ANTHROPIC_API_KEY",
	}}
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Wrapper = []string{"nsenter", "--net=/run/netns/" + hostNS}
	d.Start()
	// The HTTP listener comes up after the unix socket.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.Log(), "mcp-sandboxd ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready\n%s", d.Log())
		}
	}

	t.Run("mcp", func(t *testing.T) {
		var r struct {
			Session           apitypes.AgentRunResult `json:"session"`
			Progress          []string                `json:"progress"`
			Record            apitypes.RunRecord      `json:"record"`
			NoCLI             toolError               `json:"no_cli"`
			UnknownImage      toolError               `json:"unknown_image"`
			UnknownCredential toolError               `json:"unknown_credential"`
			CredentialOnNone  toolError               `json:"credential_on_none"`
			NoPrompt          toolError               `json:"no_prompt"`
			Errors            []string                `json:"errors"`
		}
		start := time.Now()
		if err := runClientIn(hostNS, "agent", httpTransport(d), 0, &r); err != nil {
			t.Fatal(err)
		}
		t.Logf("MCP client: %v, progress notifications %q", time.Since(start).Round(time.Millisecond), r.Progress)
		s := r.Session
		if !s.Success || s.Files["calc.py"] != "def add(a, b):\n    return a + b\n" ||
			!slices.Equal(s.Changes, []apitypes.AgentFileChange{{Path: "calc.py", Status: "added"}}) || s.RunID == "" || s.Usage.Requests == 0 {
			t.Fatalf("agent_run: %+v", s)
		}
		if !strings.Contains(s.Diff, "+++ b/calc.py\n") || !strings.Contains(s.Diff, "+    return a + b\n") {
			t.Errorf("diff %q", s.Diff)
		}
		if !slices.ContainsFunc(api.Results(), func(s string) bool { return strings.Contains(s, "1 passed") }) {
			t.Errorf("the test run the model saw did not pass: %q", api.Results())
		}
		// Progress: the start (naming the record), each tool call, the
		// changed file and the result, as they happened. A notification
		// may carry several lines (the notifier coalesces bursts).
		text := strings.Join(r.Progress, "")
		// (Claude Code waits for the model between tool calls, far longer
		// than the notifier's 50 ms coalescing: each tool call has its own
		// notification.)
		toolCalls := 0
		for _, p := range r.Progress {
			if strings.Contains(p, "tool_call ") {
				toolCalls++
			}
		}
		for _, want := range []string{"started run " + s.RunID + " in sandbox " + s.SandboxID + "\n", "tool_call Write /workspace/calc.py\n",
			"file_changed Write /workspace/calc.py\n", "tool_call Bash ", "result success\n"} {
			if !strings.Contains(text, want) {
				t.Errorf("progress lacks %q:\n%s", want, text)
			}
		}
		if toolCalls < 2 || len(r.Progress) < 3 {
			t.Errorf("%d notifications, %d naming tool calls, want ≥ 3 and ≥ 2:\n%q", len(r.Progress), toolCalls, r.Progress)
		}
		// The run record: run_get, and the transcript on disk in it.
		m := r.Record.Metadata
		if m.Kind != "agent" || m.RunID != s.RunID || !m.Success || m.SandboxID != s.SandboxID || m.Image != "agent" ||
			!strings.Contains(r.Record.Stdout, "tool_call Write /workspace/calc.py\n") || r.Record.Code["test_calc.py"] == "" {
			t.Errorf("run_get: %+v", r.Record)
		}
		if want := filepath.Join(r.Record.Dir, "transcript.jsonl"); r.Record.Dir == "" || s.Transcript != want {
			t.Errorf("transcript at %s, want %s", s.Transcript, want)
		}
		tr, err := os.ReadFile(s.Transcript)
		if err != nil {
			t.Fatal(err)
		}
		var events []string
		for _, l := range strings.Split(strings.TrimSpace(string(tr)), "\n") {
			var ev struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatalf("transcript line %q: %v", l, err)
			}
			events = append(events, ev.Type)
		}
		if len(events) < 4 || events[0] != "system" || events[len(events)-1] != "result" || !slices.Contains(events, "assistant") {
			t.Errorf("transcript events %v", events)
		}
		if keys := api.Keys(); len(keys) == 0 || slices.ContainsFunc(keys, func(k string) bool { return k != agentSecret }) {
			t.Errorf("upstream saw keys %q, want only the real one", keys)
		}

		// Bad input: taxonomy codes, messages naming the field.
		for name, c := range map[string]struct {
			got        toolError
			code, text string
		}{
			"image without the CLI": {r.NoCLI, "invalid_argument", "language: the image has no Claude Code CLI"},
			"unknown image":         {r.UnknownImage, "invalid_argument", "language: unknown image"},
			"unknown credential":    {r.UnknownCredential, "invalid_argument", `credentials[0]: unknown credential \"no-such-credential\"`},
			"credential on none":    {r.CredentialOnNone, "invalid_argument", "credentials: only valid with network egress or allowlist"},
			"no prompt":             {r.NoPrompt, "invalid_argument", "prompt: required"},
		} {
			if !c.got.IsError || !strings.Contains(c.got.Text, `"code":"`+c.code+`"`) || !strings.Contains(c.got.Text, c.text) {
				t.Errorf("%s: %+v, want %s %q", name, c.got, c.code, c.text)
			}
		}
		if len(r.Errors) > 0 {
			t.Errorf("client errors: %v", r.Errors)
		}
	})

	t.Run("sandboxctl over the REST stream", func(t *testing.T) {
		dir := t.TempDir()
		test := filepath.Join(dir, "test_calc.py")
		if err := os.WriteFile(test, []byte("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "out")
		stdout, stderr, code := d.Ctl("agent", "-p", "Make test_calc.py pass.", "--max-turns", "10", "--timeout", "3m", "--out", out, "--diff", test)
		if code != 0 {
			t.Fatalf("sandboxctl agent: exit %d\n%s\n%s", code, stdout, stderr)
		}
		// Progress lines on stderr in the order the session made them,
		// before the summary line.
		lines := strings.Split(stderr, "\n")
		idx := func(prefix string) int {
			return slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
		}
		started, write, bash, result, summary := idx("agent: started run "), idx("agent: tool_call Write /workspace/calc.py"),
			idx("agent: tool_call Bash "), idx("agent: result success"), idx("--- success true")
		if !(started >= 0 && started < write && write < bash && bash < result && result < summary) {
			t.Errorf("stderr lines out of order (%d %d %d %d %d):\n%s", started, write, bash, result, summary, stderr)
		}
		if !strings.Contains(stdout, "added    calc.py\n--- /dev/null\n+++ b/calc.py\n") {
			t.Errorf("stdout %q", stdout)
		}
		if b, err := os.ReadFile(filepath.Join(out, "calc.py")); err != nil || string(b) != "def add(a, b):\n    return a + b\n" {
			t.Errorf("--out calc.py: %v %q", err, b)
		}
		// An error before the session starts keeps its status (400 →
		// invalid_argument → exit 2), with no progress printed.
		stdout, stderr, code = d.Ctl("agent", "-p", "x", "--image", "shell", test)
		if code != 2 || !strings.Contains(stderr, "language: the image has no Claude Code CLI") || strings.Contains(stderr, "agent: ") {
			t.Errorf("sandboxctl agent --image shell: exit %d\n%s\n%s", code, stdout, stderr)
		}
	})
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}
