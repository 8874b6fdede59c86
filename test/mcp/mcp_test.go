// Package mcp drives the built mcp-sandboxd over MCP with a client we did not
// write — the official TypeScript SDK (@modelcontextprotocol/sdk, installed
// in node_modules here by `npm ci`) — over streamable HTTP and stdio, the way
// Claude Code and other MCP clients do.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also a sandbox's container init (the benchmark runs an
// engine in-process).
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

var wantTools = []string{
	"agent_run", "autofix", "autofix_status", "autofix_submit", "exec_command", "file_delete", "file_list", "file_read", "file_write", "files_export",
	"image_build", "image_build_dockerfile", "image_delete", "image_list", "image_pull", "job_kill", "job_status",
	"languages_list", "packages_install", "quota_usage", "run_code", "run_get", "run_list", "run_replay", "run_task",
	"sandbox_create", "sandbox_expose_port", "sandbox_get", "sandbox_list", "sandbox_network", "sandbox_pause", "sandbox_restore", "sandbox_resume", "sandbox_screenshot", "sandbox_snapshot", "sandbox_terminate",
	"snapshot_delete", "snapshot_list",
	"template_create", "template_delete", "template_get", "template_list",
	"vm_test",
	"volume_create", "volume_delete", "volume_get", "volume_list",
	"webhook_create", "webhook_delete", "webhook_deliveries", "webhook_get", "webhook_list", "webhook_redeliver", "webhook_update",
}

// node returns the node binary and checks that the SDK is installed.
func node(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	if _, err := os.Stat(filepath.Join(testenv.RepoRoot, "test", "mcp", "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatal("the MCP TypeScript SDK is not installed: run `npm ci` in test/mcp (scripts/install-deps.sh does)")
	}
	return bin
}

// runClient runs client.mjs and decodes its report into v.
func runClient(t *testing.T, mode string, transport map[string]any, n int, v any) {
	t.Helper()
	node(t)
	if err := runClientErr(mode, transport, n, v); err != nil {
		t.Fatal(err)
	}
}

// runClientErr is runClient for any goroutine.
func runClientErr(mode string, transport map[string]any, n int, v any) error {
	return runClientIn("", mode, transport, n, v)
}

// runClientIn runs client.mjs in network namespace netNS (/run/netns/NAME;
// empty: this process's), where a daemon that runs there listens.
func runClientIn(netNS, mode string, transport map[string]any, n int, v any) error {
	spec, _ := json.Marshal(transport)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	argv := []string{"node", "client.mjs", mode, string(spec), strconv.Itoa(n)}
	if netNS != "" {
		argv = append([]string{"nsenter", "--net=/run/netns/" + netNS, "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "mcp")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var fatal struct {
		Fatal  string   `json:"fatal"`
		Errors []string `json:"errors"`
	}
	_ = json.Unmarshal(stdout.Bytes(), &fatal)
	if err != nil || fatal.Fatal != "" {
		return fmt.Errorf("node client.mjs %s: %v\n%s\n%v\nstderr: %s", mode, err, fatal.Fatal, fatal.Errors, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		return fmt.Errorf("client report %.2000q: %v", stdout.String(), err)
	}
	return nil
}

func httpTransport(d *testenv.Daemon) map[string]any {
	return map[string]any{"type": "http", "url": "http://" + d.HTTPAddr + "/mcp", "token": d.Token()}
}

func stdioTransport(d *testenv.Daemon) map[string]any {
	return map[string]any{"type": "stdio", "command": filepath.Join(d.Bin, "mcp-sandboxd"), "args": []string{"stdio", "--config", d.CfgPath}}
}

type termination struct {
	Cause string `json:"cause"`
}

type runResult struct {
	RunID     string `json:"run_id"`
	SandboxID string `json:"sandbox_id"`
	Success   bool   `json:"success"`
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Steps     []struct {
		Name     string `json:"name"`
		ExitCode int    `json:"exit_code"`
	} `json:"steps"`
}

type errResult struct {
	IsError bool   `json:"isError"`
	Text    string `json:"text"`
}

type scenarioReport struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Instructions string                    `json:"instructions"`
	Tools        []string                  `json:"tools"`
	Annotations  map[string]map[string]any `json:"annotations"`
	Languages    []string                  `json:"languages"`
	Sandbox      struct {
		ID     string            `json:"sandbox_id"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
	} `json:"sandbox"`
	Python runResult `json:"python"`
	C      runResult `json:"c"`
	Write  struct {
		Size int `json:"size"`
	} `json:"write"`
	Read struct {
		Content string `json:"content"`
	} `json:"read"`
	Job struct {
		Stdout      string      `json:"stdout"`
		Stderr      string      `json:"stderr"`
		Polls       int         `json:"polls"`
		ExitCode    int         `json:"exit_code"`
		Termination termination `json:"termination"`
	} `json:"job"`
	Progress struct {
		Count        int    `json:"count"`
		BeforeResult int    `json:"before_result"`
		Text         string `json:"text"`
		Stdout       string `json:"stdout"`
	} `json:"progress"`
	NotFound       errResult `json:"not_found"`
	Missing        errResult `json:"missing"`
	AfterTerminate errResult `json:"after_terminate"`
	Expose         struct {
		SandboxID string `json:"sandbox_id"`
		Port      int    `json:"port"`
		URL       string `json:"url"`
		Token     string `json:"token"`
	} `json:"expose"`
	ExposeBad errResult `json:"expose_bad"`
	Terminate struct {
		State string `json:"state"`
	} `json:"terminate"`
	Errors []string `json:"errors"`
}

// checkScenario asserts what client.mjs's scenario saw.
func checkScenario(t *testing.T, r *scenarioReport) {
	t.Helper()
	if !slices.Equal(r.Tools, wantTools) {
		t.Errorf("tools = %v\nwant %v", r.Tools, wantTools)
	}
	if r.Server.Name != "mcp-sandboxd" || !strings.Contains(r.Instructions, "languages_list") {
		t.Errorf("server %q, instructions %q", r.Server.Name, r.Instructions)
	}
	if a := r.Annotations["sandbox_list"]; a["readOnlyHint"] != true || a["destructiveHint"] != false {
		t.Errorf("sandbox_list annotations %v", a)
	}
	if a := r.Annotations["sandbox_terminate"]; a["destructiveHint"] != true || a["idempotentHint"] != true {
		t.Errorf("sandbox_terminate annotations %v", a)
	}
	if !slices.Contains(r.Languages, "python") || !slices.Contains(r.Languages, "c") {
		t.Errorf("languages %v", r.Languages)
	}
	if r.Sandbox.State != "ready" || r.Sandbox.Labels["mcp.session"] == "" {
		t.Errorf("sandbox_create = %+v", r.Sandbox)
	}
	if !r.Python.Success || r.Python.Stdout != "hello from 3\n" || r.Python.RunID == "" {
		t.Errorf("python = %+v", r.Python)
	}
	if r.C.Success || len(r.C.Steps) != 1 || r.C.Steps[0].Name != "compile" || r.C.ExitCode == 0 || !strings.Contains(r.C.Stderr, "undefined_var") {
		t.Errorf("C compile error = %+v", r.C)
	}
	if r.Write.Size != 18 || r.Read.Content != "line one\nline two\n" {
		t.Errorf("file write %+v / read %+v", r.Write, r.Read)
	}
	if r.Job.Stdout != "step 1\nstep 2\nstep 3\nstep 4\nstep 5\nstep 6\n" || r.Job.Stderr != "warn\n" || r.Job.ExitCode != 2 ||
		r.Job.Termination.Cause != "exited" || r.Job.Polls < 2 {
		t.Errorf("background job = %+v", r.Job)
	}
	if r.Progress.BeforeResult < 10 || !strings.Contains(r.Progress.Text, "tick 20\n") || !strings.HasSuffix(r.Progress.Stdout, "tick 20\n") {
		t.Errorf("progress: %d notifications (%d before the result), text %q", r.Progress.Count, r.Progress.BeforeResult, r.Progress.Text)
	}
	if !r.NotFound.IsError || !strings.Contains(r.NotFound.Text, `"code":"not_found"`) {
		t.Errorf("unknown sandbox: %+v", r.NotFound)
	}
	if !r.Missing.IsError || !strings.Contains(r.Missing.Text, `"code":"invalid_argument"`) || !strings.Contains(r.Missing.Text, "path") {
		t.Errorf("missing path: %+v", r.Missing)
	}
	if e := r.Expose; e.Port != 8000 || e.Token == "" || !strings.Contains(e.URL, "/preview/"+e.SandboxID+"/8000/?sandboxd_preview_token="+e.Token) {
		t.Errorf("sandbox_expose_port: %+v", e)
	}
	if !r.ExposeBad.IsError || !strings.Contains(r.ExposeBad.Text, `"code":"invalid_argument"`) || !strings.Contains(r.ExposeBad.Text, "port: 70000") {
		t.Errorf("sandbox_expose_port with port 70000: %+v", r.ExposeBad)
	}
	if r.Terminate.State != "terminated" || !r.AfterTerminate.IsError || !strings.Contains(r.AfterTerminate.Text, `"code":"conflict"`) {
		t.Errorf("terminate %+v, then exec %+v", r.Terminate, r.AfterTerminate)
	}
	if len(r.Errors) > 0 {
		t.Errorf("client errors (e.g. non-protocol bytes on stdout): %v", r.Errors)
	}
}

func newDaemon(t *testing.T, tweak ...func(*config.Config)) *testenv.Daemon {
	d := testenv.NewDaemon(t, "python", "c")
	if len(tweak) > 0 {
		for _, f := range tweak {
			f(d.Config)
		}
		data, err := config.Marshal(d.Config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d.Start()
	node(t)
	return d
}

func TestScenario(t *testing.T) {
	d := newDaemon(t)
	t.Run("http", func(t *testing.T) {
		var r scenarioReport
		runClient(t, "scenario", httpTransport(d), 0, &r)
		checkScenario(t, &r)
	})
	t.Run("stdio via daemon", func(t *testing.T) {
		var r scenarioReport
		runClient(t, "scenario", stdioTransport(d), 0, &r)
		checkScenario(t, &r)
	})
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
	t.Run("stdio in-process", func(t *testing.T) {
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		var r scenarioReport
		runClient(t, "scenario", stdioTransport(d), 0, &r)
		checkScenario(t, &r)
		d.Start() // the cleanup wants it
	})
}

// TestUnauthorized: HTTP without the bearer token is refused with 401 and
// does nothing.
func TestUnauthorized(t *testing.T) {
	d := newDaemon(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_create","arguments":{"language":"python"}}}`
	for name, auth := range map[string]string{"no token": "", "wrong token": "Bearer 0123456789abcdef0123456789abcdef", "basic": "Basic " + d.Token()} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+d.HTTPAddr+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d %s", name, res.StatusCode, b)
		}
	}
	// The SDK gets no further either.
	spec := httpTransport(d)
	spec["token"] = "not-the-token-at-all"
	specJSON, _ := json.Marshal(spec)
	cmd := exec.Command(node(t), "client.mjs", "scenario", string(specJSON))
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "mcp")
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), "unauthenticated") {
		t.Errorf("SDK with a wrong token: %v %s", err, out)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("unauthenticated requests created sandboxes: %v", ids)
	}
}

type concurrentReport struct {
	Tag     string `json:"tag"`
	Results []struct {
		Want  string `json:"want"`
		Got   string `json:"got"`
		OK    bool   `json:"ok"`
		RunID string `json:"run_id"`
	} `json:"results"`
	Errors []string `json:"errors"`
}

// TestConcurrentClients: two HTTP clients at once, each with 10 run_code
// calls in flight together: every answer is its own, none is lost.
func TestConcurrentClients(t *testing.T) {
	// 20 ephemeral sandboxes at once; headroom over max_sandboxes because a
	// sandbox counts twice against it while it starts (pkg/sandbox).
	d := newDaemon(t, func(c *config.Config) { c.Sandbox.MaxSandboxes = 64 })
	var wg sync.WaitGroup
	reports := make([]concurrentReport, 2)
	errs := make([]error, 2)
	for i := range reports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runClientErr("concurrent", httpTransport(d), 10, &reports[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	runIDs := map[string]bool{}
	for _, r := range reports {
		if len(r.Results) != 10 || len(r.Errors) > 0 {
			t.Errorf("client %s: %d results, errors %v", r.Tag, len(r.Results), r.Errors)
		}
		for _, res := range r.Results {
			if !res.OK || !strings.HasPrefix(res.Got, r.Tag+":") {
				t.Errorf("client %s: call %s got %q", r.Tag, res.Want, res.Got)
			}
			if runIDs[res.RunID] {
				t.Errorf("run id %s answered twice", res.RunID)
			}
			runIDs[res.RunID] = true
		}
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("ephemeral sandboxes left: %v", ids)
	}
}

// TestProgressBeforeResult: 1,000 calls with a progress token, 8 in flight
// on one session, over HTTP and over stdio (the bridge): the SDK sees every
// progress notification of a request before its result, and none for a
// token it no longer knows.
func TestProgressBeforeResult(t *testing.T) {
	d := newDaemon(t)
	for name, tr := range map[string]map[string]any{"http": httpTransport(d), "stdio": stdioTransport(d)} {
		t.Run(name, func(t *testing.T) {
			var r struct {
				Calls, Notifications, Late, Wrong int
				Errors                            []string
			}
			runClient(t, "progress", tr, 1000, &r)
			// Output that comes right before the exit travels in the result
			// only (see progressSettle), so not every call has progress.
			if r.Calls != 1000 || r.Late != 0 || r.Wrong != 0 || len(r.Errors) > 0 || r.Notifications < r.Calls/4 {
				t.Errorf("%+v", r)
			}
			t.Logf("%d calls, %d progress notifications, %d after their result", r.Calls, r.Notifications, r.Late)
		})
	}
}

// BenchmarkRunCode measures run_code of Python print(1), an ephemeral
// sandbox each call, through MCP over HTTP (the TypeScript SDK against a
// daemon) and through the engine API directly (an engine in this process),
// one after the other in the same run so that their ratio means something.
// ns/op is the median call; p95-ms the 95th percentile. make bench runs it;
// the README's figures use
//
//	go test -tags seccomp -run '^$' -bench RunCode -benchtime 100x ./test/mcp
func BenchmarkRunCode(b *testing.B) {
	b.Run("mcp_http", func(b *testing.B) {
		d := testenv.NewDaemon(b, "python")
		// At the engine side's level: testenv's daemons log at debug, a
		// line per request and per sandbox step that the engine side (an
		// info logger) does not write.
		d.Config.Log.Level = "info"
		data, err := config.Marshal(d.Config)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
			b.Fatal(err)
		}
		d.Start()
		var viaMCP struct {
			MS     []float64 `json:"ms"`
			Errors []string  `json:"errors"`
		}
		b.ResetTimer()
		if err := runClientErr("bench", httpTransport(d), b.N, &viaMCP); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if len(viaMCP.Errors) > 0 {
			b.Fatalf("MCP client errors: %v", viaMCP.Errors)
		}
		if len(viaMCP.MS) != b.N {
			b.Fatalf("the client timed %d calls, want %d", len(viaMCP.MS), b.N)
		}
		reportLatency(b, viaMCP.MS)
	})
	b.Run("engine", func(b *testing.B) {
		cfg := testenv.Config(b, "mcpb")
		testenv.EnsureImages(b, "python")
		e, err := engine.New(context.Background(), cfg, testenv.Logger(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = e.Close()
			testenv.AssertNoLeftovers(b, cfg)
		})
		ctx := context.Background()
		req := engine.RunCodeRequest{Language: "python", Code: "print(1)\n"}
		if _, err := e.RunCode(ctx, req, nil); err != nil { // warm, as the MCP client does
			b.Fatal(err)
		}
		ms := make([]float64, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			res, err := e.RunCode(ctx, req, nil)
			if err != nil || res.Stdout != "1\n" {
				b.Fatalf("RunCode: %v %+v", err, res)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		b.StopTimer()
		reportLatency(b, ms)
	})
}

// reportLatency reports the median call as ns/op and the 95th percentile.
func reportLatency(b *testing.B, ms []float64) {
	median, p95 := stats(ms)
	b.ReportMetric(median*1e6, "ns/op")
	b.ReportMetric(p95, "p95-ms")
}

func stats(ms []float64) (median, p95 float64) {
	s := slices.Clone(ms)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0, 0
	}
	return s[len(s)/2], s[min(len(s)-1, (len(s)*95+99)/100-1)]
}

// TestAutofix drives the autofix tools with the official TypeScript SDK
// (which validates their output schemas): the client provider (needs_fix,
// autofix_status, autofix_submit) and the sampling provider answered by the
// SDK client's own sampling handler, over HTTP and over stdio through the
// daemon.
func TestAutofix(t *testing.T) {
	d := newDaemon(t)
	// The token file and the HTTP listener come up after the unix socket.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(d.Config.Server.AuthTokenFile); err == nil {
			if c, err := net.DialTimeout("tcp", d.HTTPAddr, time.Second); err == nil {
				c.Close()
				break
			}
		}
	}
	for name, tr := range map[string]map[string]any{"http": httpTransport(d), "stdio via daemon": stdioTransport(d)} {
		t.Run(name, func(t *testing.T) {
			var r struct {
				First struct {
					Status         string `json:"status"`
					AutofixID      string `json:"autofix_id"`
					PromptHasError bool   `json:"prompt_has_error"`
					Attempts       int    `json:"attempts"`
				} `json:"first"`
				Status struct {
					Status   string `json:"status"`
					Attempts int    `json:"attempts"`
				} `json:"status"`
				Done struct {
					Status   string `json:"status"`
					Success  bool   `json:"success"`
					Attempts int    `json:"attempts"`
					Stdout   string `json:"stdout"`
					Diff     string `json:"diff"`
				} `json:"done"`
				Sampled struct {
					Status         string   `json:"status"`
					Provider       string   `json:"provider"`
					Attempts       int      `json:"attempts"`
					Stdout         string   `json:"stdout"`
					Prompts        int      `json:"prompts"`
					PromptHasError bool     `json:"prompt_has_error"`
					Progress       []string `json:"progress"`
				} `json:"sampled"`
				Errors []string `json:"errors"`
			}
			runClient(t, "autofix", tr, 0, &r)
			if r.First.Status != "needs_fix" || !r.First.PromptHasError || r.First.Attempts != 1 || r.Status.Status != "needs_fix" {
				t.Errorf("client provider, first answer: %+v, status %+v", r.First, r.Status)
			}
			if r.Done.Status != "fixed" || !r.Done.Success || r.Done.Attempts != 2 || r.Done.Stdout != "fixed by the client\n" ||
				!strings.Contains(r.Done.Diff, "+print('fixed by the client')") {
				t.Errorf("client provider, after autofix_submit: %+v", r.Done)
			}
			if r.Sampled.Status != "fixed" || r.Sampled.Provider != "sampling" || r.Sampled.Attempts != 2 ||
				r.Sampled.Stdout != "fixed by sampling\n" || r.Sampled.Prompts != 1 || !r.Sampled.PromptHasError || len(r.Sampled.Progress) != 3 {
				t.Errorf("sampling provider: %+v", r.Sampled)
			}
			if len(r.Errors) > 0 {
				t.Errorf("client errors: %v", r.Errors)
			}
		})
	}
}
