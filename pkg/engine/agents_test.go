package engine

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/fakemessages"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// serveMessages serves a scripted Messages API on 198.18.0.2:8088 in the
// topology's upstream namespace.
func serveMessages(t *testing.T, tp *netTopology, api *fakemessages.Server) {
	tp.ServeHTTP(t, testenv.UpstreamAddr+":8088", api)
}

// agentEngine is an engine in the topology's host namespace with the
// anthropic credential pointing at the fake API.
func agentEngine(t *testing.T, tp *netTopology, maxRequests int64) *testEnv {
	secretFile := filepath.Join(t.TempDir(), "anthropic.key")
	if err := os.WriteFile(secretFile, []byte(engineTestSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	return newEngineIn(t, tp.HostNS, func(c *config.Config) {
		c.Network.DNS = []string{"198.18.0.2"}
		c.Sandbox.Memory = 1 << 30 // Claude Code's runtime
		c.Sandbox.Disk = 256 << 20
		c.Network.Credentials = map[string]config.Credential{AgentCredential: {
			BaseURL: "http://198.18.0.2:8088", Header: "x-api-key", SecretFile: secretFile,
			BaseURLEnv: "ANTHROPIC_BASE_URL", KeyEnv: "ANTHROPIC_API_KEY", MaxRequests: maxRequests,
		}}
	})
}

// pytestScript writes calc.py and runs the project's test.
var pytestScript = []fakemessages.Step{
	{Tool: "Write", Input: map[string]any{"file_path": "/workspace/calc.py", "content": "def add(a, b):\n    return a + b\n"}},
	{Tool: "Bash", Input: map[string]any{"command": "cd /workspace && python3 -m pytest -q test_calc.py", "description": "Run the tests"}},
	// The agent's own view: which process environments and files hold the
	// real key (a prefix of it is enough), and, as a control, which hold
	// the proxy's URL.
	// (The key is passed encoded: Claude Code keeps the command itself in
	// its session files under /tmp; /bin/grep because Claude Code's shell
	// maps grep to its ripgrep, which does not read /proc files.)
	{Tool: "Bash", Input: map[string]any{"command": "k=$(echo " + base64.StdEncoding.EncodeToString([]byte(engineTestSecret[:24])) + " | base64 -d); " +
		`echo key-in: $(/bin/grep -slF "$k" /proc/[0-9]*/environ; /bin/grep -rslF "$k" /workspace /tmp /home) :end; echo url-in: $(/bin/grep -sl ANTHROPIC_BASE_URL= /proc/[0-9]*/environ | wc -l)`, "description": "Look for the key"}},
}

var pytestFiles = map[string]string{"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"}

func TestAgentRun(t *testing.T) {
	requireRoot(t)
	testenv.EnsureImages(t, "shell", AgentImage)
	tp := newNetTopology(t)
	api := &fakemessages.Server{Script: pytestScript, Final: "Added calc.py with add(); the test passes.", MainTool: "Write"}
	serveMessages(t, tp, api)
	ctx := context.Background()

	t.Run("session", func(t *testing.T) {
		env := agentEngine(t, tp, 0)
		var mu sync.Mutex
		var events []AgentProgress
		res, err := env.AgentRun(ctx, AgentRunRequest{Prompt: "Make test_calc.py pass.", Files: pytestFiles, MaxTurns: 10, TimeoutSeconds: 180},
			func(p AgentProgress) {
				mu.Lock()
				events = append(events, p)
				mu.Unlock()
			})
		if err != nil {
			t.Fatal(err)
		}
		tr, _ := os.ReadFile(res.Transcript)
		if !res.Success || res.Summary != api.Final || res.Files["calc.py"] != "def add(a, b):\n    return a + b\n" ||
			!slices.Equal(res.Changes, []apitypes.AgentFileChange{{Path: "calc.py", Status: "added"}}) || res.Files["test_calc.py"] != pytestFiles["test_calc.py"] {
			t.Fatalf("session: %+v\ntranscript:\n%.3000s", res, tr)
		}
		if want := "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1,2 @@\n+def add(a, b):\n+    return a + b\n"; res.Diff != want {
			t.Fatalf("diff %q, want %q", res.Diff, want)
		}
		results := api.Results()
		if !slices.ContainsFunc(results, func(s string) bool { return strings.Contains(s, "1 passed") }) {
			t.Fatalf("the test run the model saw did not pass: %q", results)
		}
		if !slices.ContainsFunc(results, func(s string) bool {
			return strings.Contains(s, "key-in: :end") && strings.Contains(s, "url-in: ") && !strings.Contains(s, "url-in: 0")
		}) {
			t.Fatalf("the agent found the key, or its search saw no environment: %q", results)
		}
		keys := api.Keys()
		if len(keys) == 0 || slices.ContainsFunc(keys, func(k string) bool { return k != engineTestSecret }) {
			t.Fatalf("upstream saw keys %q, want only the real one", keys)
		}
		if res.Usage.Requests != int64(len(keys)) || res.Usage.InputTokens == 0 || res.Usage.OutputTokens == 0 {
			t.Fatalf("usage %+v, upstream saw %d requests", res.Usage, len(keys))
		}
		mu.Lock()
		defer mu.Unlock()
		// (Claude Code drops the "cd" to its own working directory.)
		want := []AgentProgress{{Kind: "tool_call", Tool: "Write", Detail: "/workspace/calc.py"}, {Kind: "file_changed", Tool: "Write", Detail: "/workspace/calc.py"},
			{Kind: "tool_call", Tool: "Bash", Detail: "python3 -m pytest -q test_calc.py"}, {Kind: "result", Detail: "success"}}
		for _, w := range want {
			if !slices.ContainsFunc(events, func(e AgentProgress) bool {
				return e.Kind == w.Kind && e.Tool == w.Tool && strings.HasSuffix(e.Detail, w.Detail)
			}) {
				t.Fatalf("progress %+v lacks %+v", events, w)
			}
		}
		if !strings.Contains(string(tr), `"type":"result"`) {
			t.Fatalf("transcript %s has no result", res.Transcript)
		}
		// The run record: kind agent, the input files, the transcript in
		// it, the progress log, the result.
		if events[0].Kind != "started" || events[0].RunID != res.RunID || events[0].SandboxID != res.SandboxID {
			t.Fatalf("first event %+v, result run %s sandbox %s", events[0], res.RunID, res.SandboxID)
		}
		run, err := env.GetRun(ctx, res.RunID, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if m := run.Metadata; m.Kind != "agent" || !m.Success || m.SandboxID != res.SandboxID || m.Image != AgentImage || !m.Ephemeral ||
			len(m.Steps) != 1 || m.Steps[0].Name != "agent" || !slices.Equal(m.Files, []string{"test_calc.py"}) {
			t.Fatalf("record metadata %+v", m)
		}
		if res.Transcript != filepath.Join(run.Dir, "transcript.jsonl") || run.Code["test_calc.py"] != pytestFiles["test_calc.py"] ||
			!strings.Contains(run.Stdout, "tool_call Write /workspace/calc.py\n") || !strings.HasSuffix(run.Stdout, "result success\n") {
			t.Fatalf("record %s: transcript %s, code %v, stdout %q", run.Dir, res.Transcript, run.Code, run.Stdout)
		}
		if fi, err := os.Stat(res.Transcript); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != int64(len(tr)) {
			t.Fatalf("transcript %v %v", fi, err)
		}
		var stored AgentRunResult
		if b, err := os.ReadFile(filepath.Join(run.Dir, "agent_result.json")); err != nil || json.Unmarshal(b, &stored) != nil ||
			stored.Summary != res.Summary || stored.Files["calc.py"] != res.Files["calc.py"] {
			t.Fatalf("agent_result.json: %v %+v", err, stored)
		}
		if ids := env.sandboxes.IDs(); len(ids) != 0 {
			t.Fatalf("sandboxes left after the session: %v", ids)
		}

		// Bad input: an image without the CLI, no prompt.
		if _, err := env.AgentRun(ctx, AgentRunRequest{Prompt: "x", Language: "shell"}, nil); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "language") {
			t.Fatalf("agent_run on shell: %v", err)
		}
		if _, err := env.AgentRun(ctx, AgentRunRequest{Prompt: "x", Language: "no-such-image"}, nil); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "language: unknown image") {
			t.Fatalf("agent_run on an unknown image: %v", err)
		}
		if _, err := env.AgentRun(ctx, AgentRunRequest{}, nil); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "prompt") {
			t.Fatalf("agent_run without a prompt: %v", err)
		}
	})

	t.Run("autofix provider agent", func(t *testing.T) {
		env := agentEngine(t, tp, 0)
		two, timeout := 2, 300.0
		broken := map[string]string{
			"calc.py":      "def add(a, b):\n    return a - b\n",
			"test_calc.py": pytestFiles["test_calc.py"],
			"main.py":      "from calc import add\nprint(add(2, 3))\n",
		}
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Files: broken, Entrypoint: "main.py", Success: apitypes.SuccessTests,
			Provider: apitypes.ProviderAgent, MaxRetries: &two, TimeoutSeconds: &timeout}, AutofixOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Success || res.Status != apitypes.AutofixFixed || res.Attempts > 3 || res.Files["calc.py"] != "def add(a, b):\n    return a + b\n" || res.Provider != apitypes.ProviderAgent {
			t.Fatalf("autofix with the agent: %+v", res)
		}
		if res.Attempts-1 > 2 {
			t.Fatalf("%d fixes, want at most 2", res.Attempts-1)
		}
	})

	t.Run("spend cap", func(t *testing.T) {
		env := agentEngine(t, tp, 1)
		res, err := env.AgentRun(ctx, AgentRunRequest{Prompt: "Make test_calc.py pass.", Files: pytestFiles, MaxTurns: 10, TimeoutSeconds: 180}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Success || res.Cause != "spend_cap: max_requests" || res.Usage.Requests != 1 || res.Usage.Refused == 0 {
			t.Fatalf("capped session: %+v", res)
		}
		if run, err := env.GetRun(ctx, res.RunID, 0); err != nil || run.Metadata.Success || run.Metadata.Termination.Detail != "spend_cap: max_requests" {
			t.Fatalf("capped session's record: %v %+v", err, run)
		}
	})
}
