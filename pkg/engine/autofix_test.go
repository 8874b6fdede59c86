package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
)

// fixerScript is the scripted `command` provider of the tests: a real
// program that reads the prompt on stdin (kept as prompt.<n>) and answers
// with answer.<n> from its directory, one per call.
const fixerScript = `d="$1"; n=$(cat "$d/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$d/count"; cat > "$d/prompt.$n"; cat "$d/answer.$n"`

// scriptedFixer writes the answers and returns the autofix.command that
// gives them.
func scriptedFixer(t *testing.T, answers ...string) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	for i, a := range answers {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("answer.%d", i+1)), []byte(a), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, []string{"/bin/sh", "-c", fixerScript, "fixer", dir}
}

func newAutofixEngine(t *testing.T, langs []string, command []string) *testEnv {
	t.Helper()
	return newRunEngine(t, langs, commandFixer(command))
}

// commandFixer makes command the engine's default autofix provider.
func commandFixer(command []string) func(*config.Config) {
	return func(c *config.Config) {
		c.Autofix.Provider = "command"
		c.Autofix.Command = command
	}
}

// checkAutofixRecord checks the run record of a finished loop: a snapshot,
// an error and (but for the last) a diff for every attempt.
func checkAutofixRecord(t *testing.T, env *testEnv, res *AutofixResult, files map[string]string) []apitypes.FixedAttempt {
	t.Helper()
	dir := filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID)
	var fixed []apitypes.FixedAttempt
	b, err := os.ReadFile(filepath.Join(dir, runs.FixedAttemptsJSON))
	if err != nil || json.Unmarshal(b, &fixed) != nil {
		t.Fatalf("fixed_attempts.json: %v\n%s", err, b)
	}
	if len(fixed) != res.Attempts {
		t.Fatalf("fixed_attempts.json has %d entries for %d attempts", len(fixed), res.Attempts)
	}
	for i, f := range fixed {
		n := i + 1
		if f.Attempt != n {
			t.Errorf("entry %d is attempt %d", i, f.Attempt)
		}
		for name := range files {
			if _, err := os.Stat(filepath.Join(dir, runs.SnapshotDir, fmt.Sprintf("attempt_%d", n), name)); err != nil {
				t.Errorf("attempt %d: no snapshot of %s: %v", n, name, err)
			}
		}
		last := n == len(fixed)
		if !last && (f.Error == "" || f.Fix == "" || !strings.HasPrefix(f.Fix, "--- a/") || f.Provider != "command") {
			t.Errorf("attempt %d: error %q, fix %q, provider %q", n, f.Error, f.Fix, f.Provider)
		}
		if last && res.Success && (f.Error != "" || f.Fix != "" || f.ExitCode != 0) {
			t.Errorf("last attempt: %+v", f)
		}
	}
	var m runs.Metadata
	if b, err := os.ReadFile(filepath.Join(dir, runs.MetadataJSON)); err != nil || json.Unmarshal(b, &m) != nil {
		t.Fatalf("metadata.json: %v", err)
	}
	if m.Kind != "autofix" || m.Attempts != res.Attempts || m.Success != res.Success {
		t.Errorf("metadata: kind %s attempts %d success %v; result attempts %d success %v", m.Kind, m.Attempts, m.Success, res.Attempts, res.Success)
	}
	return fixed
}

func TestAutofixScriptedCommand(t *testing.T) {
	// Python and the test scenario share an engine; the others get theirs.
	type scenario struct {
		lang     string
		files    map[string]string
		success  string
		answers  []string
		attempts int
		errText  string // in attempt 1's error
		final    map[string]string
		// promptText, if set, must be in the fixer's first prompt too.
		promptText string
	}
	scenarios := map[string]scenario{
		"python NameError": {
			lang:     "python",
			files:    map[string]string{"main.py": "message = 'hello'\nprint(mesage)\n"},
			answers:  []string{"Here is the fix:\n\n```python main.py\nmessage = 'hello'\nprint(message)\n```\n"},
			attempts: 2, errText: "NameError: name 'mesage' is not defined",
			final: map[string]string{"main.py": "message = 'hello'\nprint(message)\n"},
		},
		"python blocked syscall": {
			// seccomp refuses unshare; the diagnostics name it in the fix request.
			lang:     "python",
			files:    map[string]string{"main.py": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.unshare(0x10000000) != 0:\n    raise OSError(ctypes.get_errno(), 'unshare refused')\nprint('isolated')\n"},
			answers:  []string{"```python main.py\nprint('no namespace needed')\n```\n"},
			attempts: 2, errText: "unshare refused",
			promptText: "The sandbox refused these system calls (seccomp; they are not allowed here, so the program must do without them): unshare ×1.",
		},
		"python missing import": {
			lang:     "python",
			files:    map[string]string{"main.py": "print(math.sqrt(16))\n"},
			answers:  []string{"```diff\n--- a/main.py\n+++ b/main.py\n@@ -1 +1,2 @@\n+import math\n print(math.sqrt(16))\n```\n"},
			attempts: 2, errText: "NameError: name 'math' is not defined",
			final: map[string]string{"main.py": "import math\nprint(math.sqrt(16))\n"},
		},
		"python failing pytest (rule tests)": {
			lang: "python", success: apitypes.SuccessTests,
			files: map[string]string{
				"main.py":      "def add(a, b):\n    return a - b\n\nprint(add(1, 1))\n",
				"test_main.py": "from main import add\n\ndef test_add():\n    assert add(2, 3) == 5\n",
			},
			answers:  []string{"--- a/main.py\n+++ b/main.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"},
			attempts: 2, errText: "assert -1 == 5",
		},
		"javascript TypeError": {
			lang:  "javascript",
			files: map[string]string{"main.js": "const user = null;\nconsole.log(user.name.length);\n"},
			answers: []string{
				// A first fix that fails differently, then the real one.
				"```javascript main.js\nconst user = {};\nconsole.log(user.name.length);\n```\n",
				"```javascript main.js\nconst user = {name: 'ada'};\nconsole.log(user.name.length);\n```\n",
			},
			attempts: 3, errText: "TypeError: Cannot read properties of null",
		},
		"go compile error": {
			lang:     "go",
			files:    map[string]string{"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(greeting)\n}\n"},
			answers:  []string{"```go main.go\npackage main\n\nimport \"fmt\"\n\nconst greeting = \"hi\"\n\nfunc main() {\n\tfmt.Println(greeting)\n}\n```\n"},
			attempts: 2, errText: "undefined: greeting",
		},
	}
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	requireRoot(t)
	ensureImages(t, "python", "javascript", "go")
	for _, name := range names {
		sc := scenarios[name]
		t.Run(name, func(t *testing.T) {
			dir, cmd := scriptedFixer(t, sc.answers...)
			env := newAutofixEngine(t, []string{sc.lang}, cmd)
			var events []string
			res, err := env.Autofix(context.Background(), AutofixRequest{Language: sc.lang, Files: sc.files, Success: sc.success},
				AutofixOptions{OnEvent: func(ev apitypes.AutofixEvent) { events = append(events, ev.Type) }})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Success || res.Status != apitypes.AutofixFixed || res.Attempts != sc.attempts {
				t.Fatalf("status %s (%s: %s) after %d attempts, want fixed after %d\n%+v", res.Status, res.StopReason, res.Error, res.Attempts, sc.attempts, res.History)
			}
			fixed := checkAutofixRecord(t, env, res, sc.files)
			if !strings.Contains(fixed[0].Error, sc.errText) {
				t.Errorf("attempt 1 error %q lacks %q", fixed[0].Error, sc.errText)
			}
			prompt, _ := os.ReadFile(filepath.Join(dir, "prompt.1"))
			if !strings.Contains(string(prompt), sc.errText) {
				t.Errorf("the fixer's prompt lacks the error %q:\n%s", sc.errText, prompt)
			}
			if sc.promptText != "" && !strings.Contains(string(prompt), sc.promptText) {
				t.Errorf("the fixer's prompt lacks %q:\n%s", sc.promptText, prompt)
			}
			for p, want := range sc.final {
				if res.Files[p] != want {
					t.Errorf("final %s = %q, want %q", p, res.Files[p], want)
				}
			}
			if res.Diff == "" || len(events) != 2*sc.attempts {
				t.Errorf("diff %q, events %v", res.Diff, events)
			}
			if sc.success == apitypes.SuccessTests {
				last := res.LastResult.Steps[len(res.LastResult.Steps)-1]
				if last.Name != "test" || last.ExitCode != 0 || !strings.Contains(last.Stdout, "1 passed") {
					t.Errorf("last step %+v", last)
				}
			}
			// The loop's sandbox is gone.
			if ids := env.sandboxes.IDs(); len(ids) != 0 {
				t.Errorf("live sandboxes after the loop: %v", ids)
			}
			st, err := env.AutofixStatus(context.Background(), res.AutofixID)
			if err != nil || st.Status != apitypes.AutofixFixed || st.Attempts != sc.attempts {
				t.Errorf("status: %+v, %v", st, err)
			}
		})
	}
}

// A missing dependency: the fix adds it to requirements.txt (here a local
// wheel, as the sandbox has no network) and the loop installs
// again before the next run.
func TestAutofixReinstallsDependencies(t *testing.T) {
	requireRoot(t)
	_, cmd := scriptedFixer(t, "```text requirements.txt\n./greet-1.0-py3-none-any.whl\n```\n")
	env := newAutofixEngine(t, []string{"python"}, cmd)
	files := map[string]string{
		"main.py":                    "import greet\nprint(greet.hello())\n",
		"requirements.txt":           "\n",
		"greet-1.0-py3-none-any.whl": string(testenv.Wheel(t, "greet", "1.0", "def hello():\n    return 'hi'\n")),
	}
	res, err := env.Autofix(context.Background(), AutofixRequest{Language: "python", Files: files, Success: apitypes.SuccessExitZero}, AutofixOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != apitypes.AutofixFixed || res.Attempts != 2 {
		t.Fatalf("%s (%s) after %d attempts: %+v", res.Status, res.Error, res.Attempts, res.History)
	}
	var installs []string
	for _, st := range res.LastResult.Steps {
		installs = append(installs, st.Name)
	}
	if installs[0] != "install" || res.LastResult.Stdout != "hi\n" {
		t.Fatalf("attempt 2 steps %v, stdout %q", installs, res.LastResult.Stdout)
	}
}

func TestAutofixStops(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	broken := map[string]string{"main.py": "print(undefined_name)\n"}
	t.Run("never fixes", func(t *testing.T) {
		_, cmd := scriptedFixer(t, "print(undefined_1)\n", "print(undefined_2)\n")
		env := newAutofixEngine(t, []string{"python"}, cmd)
		two := 2
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Files: broken, MaxRetries: &two}, AutofixOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Success || res.StopReason != apitypes.StopMaxRetries || res.Attempts != 3 {
			t.Fatalf("%s %s after %d attempts", res.Status, res.StopReason, res.Attempts)
		}
		checkAutofixRecord(t, env, res, broken)
	})
	t.Run("hangs", func(t *testing.T) {
		env := newAutofixEngine(t, []string{"python"}, []string{"/bin/sh", "-c", "sleep 120"})
		timeout := 2.0
		start := time.Now()
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Files: broken, TimeoutSeconds: &timeout}, AutofixOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.StopReason != apitypes.StopTimeout || time.Since(start) > 10*time.Second {
			t.Fatalf("%s after %v", res.StopReason, time.Since(start))
		}
	})
	t.Run("same code", func(t *testing.T) {
		_, cmd := scriptedFixer(t, "```python main.py\nprint(undefined_name)\n```\n")
		env := newAutofixEngine(t, []string{"python"}, cmd)
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Files: broken}, AutofixOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.StopReason != apitypes.StopNoChange || res.Attempts != 1 || !strings.Contains(res.Error, "unchanged") {
			t.Fatalf("%s after %d attempts: %s", res.StopReason, res.Attempts, res.Error)
		}
	})
	t.Run("refused answers", func(t *testing.T) {
		_, cmd := scriptedFixer(t,
			"--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-print(something_else)\n+print(1)\n",
			"--- /dev/null\n+++ /etc/cron.d/evil\n@@ -0,0 +1 @@\n+* * * * * root sh\n",
			"```python main.py\nprint(1)\n```\n")
		env := newAutofixEngine(t, []string{"python"}, cmd)
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Files: broken}, AutofixOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != apitypes.AutofixFixed || res.Attempts != 2 {
			t.Fatalf("%s (%s) after %d attempts", res.Status, res.Error, res.Attempts)
		}
		fixed := checkAutofixRecord(t, env, res, broken)
		if !strings.Contains(fixed[0].Refused, "does not apply") || !strings.Contains(fixed[0].Refused, "outside /workspace") {
			t.Fatalf("refusals not recorded: %+v", fixed[0])
		}
	})
}

func TestAutofixBadInput(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	zero, big := 0, 21
	neg := -1.0
	for _, tc := range []struct {
		req  AutofixRequest
		code errdefs.Code
		msg  string
	}{
		{AutofixRequest{Language: "python", Code: "x", MaxRetries: &zero}, errdefs.InvalidArgument, "max_retries: must be between 1 and 20, got 0"},
		{AutofixRequest{Language: "python", Code: "x", MaxRetries: &big}, errdefs.InvalidArgument, "max_retries: must be between 1 and 20, got 21"},
		{AutofixRequest{Language: "python", Code: "x", Provider: "openai"}, errdefs.InvalidArgument, "provider: unknown provider \"openai\""},
		{AutofixRequest{Language: "python", Code: "x", Provider: "command"}, errdefs.InvalidArgument, "provider: command is not configured"},
		{AutofixRequest{Language: "python", Code: "x", Provider: "anthropic"}, errdefs.InvalidArgument, "provider: anthropic is not configured"},
		{AutofixRequest{Language: "python", Code: "x", Success: "green"}, errdefs.InvalidArgument, "success: must be"},
		{AutofixRequest{Language: "python", Code: "x", TimeoutSeconds: &neg}, errdefs.InvalidArgument, "timeout_seconds"},
		{AutofixRequest{Language: "cobol", Code: "x"}, errdefs.InvalidArgument, "language: unknown language"},
		{AutofixRequest{Language: "python"}, errdefs.InvalidArgument, "code: required"},
		{AutofixRequest{Language: "python", Files: map[string]string{"../x.py": "1"}}, errdefs.InvalidArgument, "outside /workspace"},
	} {
		t.Setenv("ANTHROPIC_API_KEY", "")
		_, err := env.Autofix(ctx, tc.req, AutofixOptions{})
		if errdefs.CodeOf(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Autofix(%+v) = %v, want %s containing %q", tc.req, err, tc.code, tc.msg)
		}
	}
	for _, tc := range []struct {
		req  AutofixSubmitRequest
		code errdefs.Code
	}{
		{AutofixSubmitRequest{AutofixID: "nope", Code: "x"}, errdefs.InvalidArgument},
		{AutofixSubmitRequest{AutofixID: "af-0123456789abcdef", Code: "x"}, errdefs.NotFound},
		{AutofixSubmitRequest{AutofixID: "af-0123456789abcdef"}, errdefs.InvalidArgument},
	} {
		if _, err := env.AutofixSubmit(ctx, tc.req, AutofixOptions{}); errdefs.CodeOf(err) != tc.code {
			t.Errorf("AutofixSubmit(%+v) = %v, want %s", tc.req, err, tc.code)
		}
	}
	if ids := env.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("bad input left sandboxes: %v", ids)
	}
}

// The client provider: needs_fix with a prompt, then autofix_submit, with
// the engine closed and opened again in between (a daemon restart: the
// session is in SQLite, the sandbox is adopted).
func TestAutofixClientSessionAcrossRestart(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Code: "print(undefined_name)\n", Provider: "client"}, AutofixOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != apitypes.AutofixNeedsFix || res.AutofixID == "" || !strings.Contains(res.Prompt, "NameError") || res.ExpiresAt == nil {
		t.Fatalf("first answer: %+v", res)
	}
	// Restart: a second engine on the same state adopts the sandbox and
	// reads the session.
	env.sandboxes.Close()
	if err := env.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	e2, err := New(ctx, env.cfg, env.log)
	if err != nil {
		t.Fatal(err)
	}
	env.Engine = e2
	st, err := e2.AutofixStatus(ctx, res.AutofixID)
	if err != nil || st.Status != apitypes.AutofixNeedsFix {
		t.Fatalf("status after restart: %+v, %v", st, err)
	}
	// A first submission that still fails, then the fix.
	res2, err := e2.AutofixSubmit(ctx, AutofixSubmitRequest{AutofixID: res.AutofixID, Code: "print(still_undefined)\n"}, AutofixOptions{})
	if err != nil || res2.Status != apitypes.AutofixNeedsFix || res2.Attempts != 2 || !strings.Contains(res2.Prompt, "still_undefined") {
		t.Fatalf("submit 1: %+v, %v", res2, err)
	}
	res3, err := e2.AutofixSubmit(ctx, AutofixSubmitRequest{AutofixID: res.AutofixID, Files: map[string]string{"main.py": "print('fixed')\n"}}, AutofixOptions{})
	if err != nil || res3.Status != apitypes.AutofixFixed || res3.Attempts != 3 || res3.LastResult.Stdout != "fixed\n" {
		t.Fatalf("submit 2: %+v, %v", res3, err)
	}
	if res3.SandboxID != res.SandboxID {
		t.Errorf("the loop changed sandbox: %s then %s", res.SandboxID, res3.SandboxID)
	}
	dir := filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID)
	for n := 1; n <= 3; n++ {
		if _, err := os.Stat(filepath.Join(dir, runs.SnapshotDir, fmt.Sprintf("attempt_%d", n), "main.py")); err != nil {
			t.Errorf("attempt %d snapshot: %v", n, err)
		}
	}
	var fixed []apitypes.FixedAttempt
	b, _ := os.ReadFile(filepath.Join(dir, runs.FixedAttemptsJSON))
	if json.Unmarshal(b, &fixed) != nil || len(fixed) != 3 || fixed[0].Provider != "client" || !strings.Contains(fixed[1].Fix, "+print('fixed')") {
		t.Fatalf("fixed_attempts.json: %s", b)
	}
	if _, err := e2.AutofixSubmit(ctx, AutofixSubmitRequest{AutofixID: res.AutofixID, Code: "x"}, AutofixOptions{}); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Fatalf("submit to a finished loop: %v", err)
	}
	if ids := e2.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("live sandboxes after the loop: %v", ids)
	}
}

// An unanswered client session expires: its sandbox goes, its record is
// finished as expired.
func TestAutofixClientSessionExpires(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"}, func(c *config.Config) { c.Autofix.SessionTTL = config.Duration(500 * time.Millisecond) })
	ctx := context.Background()
	res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Code: "print(undefined_name)\n"}, AutofixOptions{})
	if err != nil || res.Status != apitypes.AutofixNeedsFix {
		t.Fatalf("%+v, %v", res, err)
	}
	time.Sleep(700 * time.Millisecond)
	st, err := env.AutofixStatus(ctx, res.AutofixID)
	if err != nil || st.Status != apitypes.AutofixExpired || st.StopReason != apitypes.StopExpired {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if ids := env.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("live sandboxes after expiry: %v", ids)
	}
	run, err := env.GetRun(ctx, res.RunID, 0)
	if err != nil || run.Metadata.Success || run.Metadata.Kind != "autofix" || len(run.Attempts) != 1 {
		t.Fatalf("record: %+v, %v", run, err)
	}
}

// A loop an earlier daemon was running when it stopped is ended by the
// next one: record finished, sandbox removed, status failed.
func TestAutofixInterruptedLoop(t *testing.T) {
	requireRoot(t)
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Code: "print(undefined_name)\n"}, AutofixOptions{})
	if err != nil || res.Status != apitypes.AutofixNeedsFix {
		t.Fatalf("%+v, %v", res, err)
	}
	// As the daemon died during an attempt: the row says running.
	// (The autofix service's row, rewritten through the store: its state
	// is JSON the service reads back.)
	row, err := env.store.GetAutofixSession(ctx, res.AutofixID)
	if err != nil {
		t.Fatal(err)
	}
	var state map[string]any
	if err := json.Unmarshal(row.State, &state); err != nil {
		t.Fatalf("session state %s: %v", row.State, err)
	}
	loop, ok := state["state"].(map[string]any)
	if !ok || loop["status"] != apitypes.AutofixNeedsFix {
		t.Fatalf("session state %s: no loop state waiting for a fix", row.State)
	}
	loop["status"] = apitypes.AutofixRunning
	if row.State, err = json.Marshal(state); err != nil {
		t.Fatal(err)
	}
	row.Status = apitypes.AutofixRunning
	if err := env.store.PutAutofixSession(ctx, row); err != nil {
		t.Fatal(err)
	}
	env.sandboxes.Close()
	if err := env.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	e2, err := New(ctx, env.cfg, env.log)
	if err != nil {
		t.Fatal(err)
	}
	env.Engine = e2
	st, err := e2.AutofixStatus(ctx, res.AutofixID)
	if err != nil || st.Status != apitypes.AutofixFailed || st.StopReason != apitypes.StopError || !strings.Contains(st.Error, "daemon stopped") {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if ids := e2.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("live sandboxes: %v", ids)
	}
	run, err := e2.GetRun(ctx, res.RunID, 0)
	if err != nil || run.Metadata.Success || !strings.Contains(run.Metadata.Error, "daemon stopped") {
		t.Fatalf("record: %+v, %v", run, err)
	}
}
