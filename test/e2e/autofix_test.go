package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// writeConfig rewrites the daemon's configuration after a change.
func writeConfig(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sandboxctl autofix with a scripted command provider: attempts shown as
// they happen, the diff at the end, fix_attempt events on the events
// WebSocket, the correction in `runs export`, the metrics.
func TestAutofixCLI(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t, "python")
	fixer := filepath.Join(t.TempDir(), "answer")
	if err := os.WriteFile(fixer, []byte("```python main.py\nimport math\nprint(math.pi > 3)\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Config.Autofix.Provider = "command"
	d.Config.Autofix.Command = []string{"/bin/sh", "-c", "cat >/dev/null; cat " + fixer}
	writeConfig(t, d)
	d.Start()

	c, err := client.New(client.Options{Socket: d.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu     sync.Mutex
		events []apitypes.Event
	)
	subscribed := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		once := sync.Once{}
		_ = c.Events(ctx, "", func(ev client.Event) error {
			once.Do(func() { close(subscribed) })
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
			return nil
		})
	}()
	// The subscription is live once it delivers: create and remove a
	// sandbox to see its events.
	deadline := time.Now().Add(10 * time.Second)
	for ready := false; !ready && time.Now().Before(deadline); {
		id := createSandbox(d)
		d.MustCtl("rm", id)
		select {
		case <-subscribed:
			ready = true
		case <-time.After(200 * time.Millisecond):
		}
	}

	src := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(src, []byte("print(math.pi > 3)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.Ctl("autofix", "--lang", "python", src)
	if code != 0 {
		t.Fatalf("sandboxctl autofix: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"attempt 1: exit 1", "NameError: name 'math' is not defined", "fix by command: main.py +1 -0", "attempt 2: ok", "fixed after 2 attempt(s)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, "--- a/main.py\n+++ b/main.py\n") || !strings.Contains(out, "+import math\n") {
		t.Errorf("stdout is not the diff:\n%s", out)
	}

	export := d.MustCtl("runs", "export", "--format", "jsonl")
	var rec apitypes.CorrectionRecord
	lines := strings.Split(strings.TrimSpace(export), "\n")
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil {
		t.Fatalf("export: %q", export)
	}
	if rec.Language != "python" || rec.Code["main.py"] != "print(math.pi > 3)\n" || !strings.Contains(rec.Error, "NameError") ||
		!strings.Contains(rec.Fix, "+import math") || rec.Outcome != "fixed" || rec.Provider != "command" {
		t.Errorf("correction: %+v", rec)
	}

	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	mu.Lock()
	var kinds []string
	for _, ev := range events {
		if ev.Type == "fix_attempt" && ev.Autofix != nil {
			kinds = append(kinds, ev.Autofix.Type)
		}
	}
	mu.Unlock()
	if strings.Join(kinds, " ") != "attempt fix attempt result" {
		t.Errorf("fix_attempt events: %v", kinds)
	}

	res, err := d.UnixGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	for _, want := range []string{`sandboxd_autofix_runs_total{outcome="fixed"} 1`, "sandboxd_autofix_attempts_per_success_sum 2", "sandboxd_autofix_time_to_fix_seconds_count 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// The client provider over MCP (streamable HTTP, a real client session):
// autofix → needs_fix, the daemon restarts, autofix_submit → fixed.
func TestAutofixClientOverMCPAcrossRestart(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t, "python")
	d.Start()
	call := func(name string, args map[string]any) apitypes.AutofixResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := mcpSession(ctx, t, d)
		defer c.Close()
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := c.CallTool(ctx, req)
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
		var out apitypes.AutofixResult
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := call("autofix", map[string]any{"language": "python", "code": "print(undefined_name)\n"})
	if first.Status != apitypes.AutofixNeedsFix || !strings.Contains(first.Prompt, "NameError") {
		t.Fatalf("autofix: %+v", first)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Start()
	done := call("autofix_submit", map[string]any{"autofix_id": first.AutofixID, "code": "print('after restart')\n"})
	if done.Status != apitypes.AutofixFixed || done.Attempts != 2 || done.LastResult.Stdout != "after restart\n" || done.SandboxID != first.SandboxID {
		t.Fatalf("autofix_submit after restart: %+v", done)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("live sandboxes after the loop: %v", ids)
	}
}

// The anthropic provider against a local fake Messages API: the daemon has
// the key in its environment; the key must not reach the daemon's log, the
// run record or the sandbox (whose program prints its whole environment).
func TestAutofixAnthropicKeyStaysOut(t *testing.T) {
	testenv.RequireRoot(t)
	const key = "sk-ant-e2e-4f1c9a7b2e-SECRET"
	var (
		mu                 sync.Mutex // the handler runs on the server's goroutines
		gotKey, gotVersion string
		calls              int
	)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		gotKey, gotVersion = r.Header.Get("x-api-key"), r.Header.Get("anthropic-version")
		if calls == 1 {
			w.Header().Set("retry-after", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
			return
		}
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
			"content":     []any{map[string]any{"type": "text", "text": "```python main.py\nimport os\nprint(sorted(os.environ.items()))\n```\n"}},
			"stop_reason": "end_turn", "usage": map[string]any{"input_tokens": 100, "output_tokens": 20}})
	}))
	defer fake.Close()
	d := testenv.NewDaemon(t, "python")
	d.Config.Autofix.Provider = "anthropic"
	d.Config.Autofix.BaseURL = fake.URL
	d.Config.Autofix.APIKeyEnv = "SANDBOXD_E2E_ANTHROPIC_KEY"
	d.ExtraEnv = append(d.ExtraEnv, "SANDBOXD_E2E_ANTHROPIC_KEY="+key)
	writeConfig(t, d)
	d.Start()
	src := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(src, []byte("import os\nprint(sorted(os.environ.items()))\nraise SystemExit(3)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.Ctl("--json", "autofix", "--lang", "python", src)
	if code != 0 {
		t.Fatalf("autofix: exit %d\n%s\n%s", code, out, errOut)
	}
	var res apitypes.AutofixResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Attempts != 2 || res.History[0].Tokens == nil || res.History[0].Tokens.InputTokens != 100 {
		t.Fatalf("result: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 || gotKey != key || gotVersion == "" {
		t.Fatalf("fake API: %d calls, key ok %v, version %q", calls, gotKey == key, gotVersion)
	}
	// The programs printed their environment: it is in the record's stdout.log.
	runDir := filepath.Join(d.Config.Paths.StateDir, "runs", res.RunID)
	stdout, _ := os.ReadFile(filepath.Join(runDir, "stdout.log"))
	if !strings.Contains(string(stdout), "PATH") {
		t.Fatalf("the program's environment is not in the record: %q", stdout)
	}
	err := filepath.WalkDir(runDir, func(p string, de os.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), "SECRET") {
			t.Errorf("the API key is in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.Log(), "SECRET") || strings.Contains(out+errOut, "SECRET") {
		t.Errorf("the API key is in the daemon's log or the CLI's output")
	}
}

// mcpSession is an initialized MCP client session with daemon d over
// streamable HTTP; the caller closes it.
func mcpSession(ctx context.Context, t *testing.T, d *testenv.Daemon) *mcpclient.Client {
	t.Helper()
	waitHTTP(t, d)
	c, err := mcpclient.NewStreamableHttpClient("http://"+d.HTTPAddr+"/mcp",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + d.Token()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		c.Close()
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "e2e", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// waitHTTP waits for the daemon's HTTP listener, which comes up after the
// unix socket Start waits for.
func waitHTTP(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", d.HTTPAddr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("no HTTP listener on %s", d.HTTPAddr)
}
