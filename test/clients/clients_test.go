package clients_test

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
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// cliPath is a file of the pinned npm packages (scripts/install-deps.sh
// runs npm ci in test/clients).
func cliPath(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join(testenv.RepoRoot, "test", "clients", "node_modules", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the client CLIs are not installed (scripts/install-deps.sh runs npm ci in test/clients): %v", err)
	}
	return p
}

// transportCase is one way a client reaches the server.
type transportCase struct {
	name  string
	stdio []string // command and arguments; nil: HTTP
	url   string
	token string
}

// setup starts a daemon and returns its transports and the tools it lists
// (name -> input schema).
func setup(t *testing.T) (*testenv.Daemon, []transportCase, map[string]any) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t, "python")
	d.Start()
	waitHTTP(t, d)
	bin := filepath.Join(d.Bin, "mcp-sandboxd")
	cases := []transportCase{
		{name: "stdio", stdio: []string{bin, "stdio", "--config", d.CfgPath}},
		{name: "http", url: "http://" + d.HTTPAddr + "/mcp", token: d.Token()},
	}
	return d, cases, listTools(t, cases[1].url, d.Token())
}

// listTools asks the daemon for its tools (name -> input schema), as
// plain JSON-RPC over HTTP: the schemas exactly as a client gets them.
func listTools(t *testing.T, url, token string) map[string]any {
	t.Helper()
	session := ""
	post := func(body string) []byte {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
			session = id
		}
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s: %s: %s", url, resp.Status, data)
		}
		// An SSE answer: the last data line is the response.
		if i := bytes.LastIndex(data, []byte("data: ")); i >= 0 && !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
			data = data[i+len("data: "):]
		}
		return data
	}
	post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"clients-test","version":"0"}}}`)
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	var res struct {
		Result struct {
			Tools []struct {
				Name        string `json:"name"`
				InputSchema any    `json:"inputSchema"`
			} `json:"tools"`
		} `json:"result"`
	}
	data := post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("tools/list: %v: %.300s", err, data)
	}
	tools := map[string]any{}
	for _, tl := range res.Result.Tools {
		tools[tl.Name] = tl.InputSchema
	}
	if len(tools) < 20 {
		t.Fatalf("the daemon lists %d tools", len(tools))
	}
	return tools
}

// waitHTTP waits for the daemon's HTTP listener, which comes up after the
// unix socket Start waits for.
func waitHTTP(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", d.HTTPAddr); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("HTTP listener %s did not come up", d.HTTPAddr)
}

// checkRun reports what the model saw of a run: every step's result
// checked, each as the script wants, and every tool with its schema.
func checkRun(t *testing.T, name string, p *player, want map[string]any, runErr error, output string) {
	t.Helper()
	checked, problems, tools := p.report()
	defer func() {
		if t.Failed() {
			p.mu.Lock()
			for i, r := range p.results {
				t.Logf("%s: result %d as the model saw it: %.1500s", name, i+1, r)
			}
			p.mu.Unlock()
		}
	}()
	if runErr != nil {
		t.Errorf("%s: %v\n%.3000s", name, runErr, output)
	}
	for _, prob := range problems {
		t.Errorf("%s: %s", name, prob)
	}
	if checked != len(p.script) {
		t.Errorf("%s: %d of %d tool results reached the model\n%.3000s", name, checked, len(p.script), output)
	}
	var missing, changed, added []string
	for n, schema := range want {
		got, ok := tools[n]
		if !ok {
			missing = append(missing, n)
			continue
		}
		ch, ad := compareSchema(normSchema(schema), normSchema(got))
		if ch {
			changed = append(changed, n)
		}
		for _, a := range ad {
			added = append(added, n+"."+a)
		}
	}
	sort.Strings(missing)
	sort.Strings(changed)
	sort.Strings(added)
	if len(missing) > 0 {
		t.Errorf("%s: tools the model was not offered: %v", name, missing)
	}
	if len(changed) > 0 {
		g, _ := json.Marshal(normSchema(tools[changed[0]]))
		w, _ := json.Marshal(normSchema(want[changed[0]]))
		t.Errorf("%s: input schemas changed on the way to the model: %v\n%s: got  %s\nwant %s", name, changed, changed[0], g, w)
	}
	if len(added) > 0 {
		t.Logf("%s: properties the client added to our schemas: %d, e.g. %s", name, len(added), added[0])
	}
}

// compareSchema reports whether got differs from want other than by
// properties the client added (Gemini CLI adds wait_for_previous to every
// tool), and those added properties.
func compareSchema(want, got any) (changed bool, added []string) {
	w, wok := want.(map[string]any)
	g, gok := got.(map[string]any)
	if !wok || !gok {
		return !reflect.DeepEqual(want, got), nil
	}
	wp, _ := w["properties"].(map[string]any)
	gp, _ := g["properties"].(map[string]any)
	for k := range gp {
		if _, ok := wp[k]; !ok {
			added = append(added, k)
		}
	}
	for k, v := range wp {
		if !reflect.DeepEqual(v, gp[k]) {
			return true, added
		}
	}
	for k, v := range w {
		if k != "properties" && !reflect.DeepEqual(v, g[k]) {
			return true, added
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok && k != "properties" {
			return true, added
		}
	}
	return false, added
}

// normSchema drops what does not change a schema's meaning: the $schema
// dialect, an empty "properties" (Codex CLI adds one to every object), and
// the OpenAPI spelling of a nullable type that Gemini CLI turns ours into
// ({"type": T, "nullable": true} for {"type": ["null", T]}).
func normSchema(v any) any {
	b, _ := json.Marshal(v)
	var m any
	_ = json.Unmarshal(b, &m)
	var walk func(x any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			delete(x, "$schema")
			if x["nullable"] == true {
				if t, ok := x["type"].(string); ok {
					x["type"] = []any{"null", t}
					delete(x, "nullable")
				}
			}
			if p, ok := x["properties"].(map[string]any); ok && len(p) == 0 {
				delete(x, "properties")
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(m)
	return m
}

// TestCodex runs the script through Codex CLI over stdio and HTTP.
func TestCodex(t *testing.T) {
	testenv.RequireRoot(t)
	bin := cliPath(t, "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
	d, cases, want := setup(t)
	silent := silentFor()
	var wg sync.WaitGroup
	for _, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "codex-" + tc.name
			p := newPlayer(name, silent)
			api := newFakeResponses(t, p, "sandbox")
			home := t.TempDir()
			// As Codex's docs tell a user: ~/.codex/config.toml with a
			// model provider (the Responses wire API) and the MCP server.
			var cfg strings.Builder
			// Codex cuts a tool output it hands the model to its own limit
			// (12,020 of our 48,964 characters, issue 23) unless
			// tool_output_token_limit makes room for our whole budget.
			fmt.Fprintf(&cfg, "model = %q\nmodel_provider = \"fake\"\napproval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\ntool_output_token_limit = 30000\n\n", "gpt-5.1-codex")
			fmt.Fprintf(&cfg, "[model_providers.fake]\nname = \"fake\"\nbase_url = %q\nwire_api = \"responses\"\nenv_key = \"FAKE_OPENAI_KEY\"\n\n", api.URL())
			fmt.Fprintf(&cfg, "[mcp_servers.sandbox]\nstartup_timeout_sec = 60\ntool_timeout_sec = %d\n", int(silent.Seconds())+120)
			if tc.stdio != nil {
				args, _ := json.Marshal(tc.stdio[1:])
				fmt.Fprintf(&cfg, "command = %q\nargs = %s\n", tc.stdio[0], args)
			} else {
				fmt.Fprintf(&cfg, "url = %q\nbearer_token_env_var = \"SANDBOXD_TOKEN\"\n", tc.url)
			}
			codexHome := filepath.Join(home, ".codex")
			if err := os.MkdirAll(codexHome, 0o700); err != nil {
				t.Error(err)
				return
			}
			if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(cfg.String()), 0o600); err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), silent+5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "Run the sandbox checks.")
			cmd.Dir = home
			cmd.Env = []string{"HOME=" + home, "CODEX_HOME=" + codexHome, "PATH=/usr/local/bin:/usr/bin:/bin",
				"FAKE_OPENAI_KEY=sk-fake", "SANDBOXD_TOKEN=" + tc.token, "RUST_LOG=warn"}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			t.Logf("%s: codex ran %s", name, time.Since(start).Round(time.Second))
			checkRun(t, name, p, want, err, out.String())
		}()
	}
	wg.Wait()
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left behind: %v", ids)
	}
	logBig(t, "codex")
}

// TestGemini runs the script through Gemini CLI over stdio and HTTP.
func TestGemini(t *testing.T) {
	testenv.RequireRoot(t)
	js := cliPath(t, "@google/gemini-cli/bundle/gemini.js")
	d, cases, want := setup(t)
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	silent := silentFor()
	var wg sync.WaitGroup
	for _, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "gemini-" + tc.name
			p := newPlayer(name, silent)
			api := newFakeGemini(t, p, names)
			home := t.TempDir()
			work := filepath.Join(home, "work")
			gdir := filepath.Join(home, ".gemini")
			for _, dir := range []string{work, gdir} {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Error(err)
					return
				}
			}
			// As Gemini CLI's docs tell a user: ~/.gemini/settings.json with
			// the MCP server (trusted: no confirmation per call), and the
			// working folder trusted, or the CLI disables its MCP servers.
			srv := map[string]any{"timeout": (silent + 2*time.Minute).Milliseconds(), "trust": true}
			if tc.stdio != nil {
				srv["command"], srv["args"] = tc.stdio[0], tc.stdio[1:]
			} else {
				srv["httpUrl"], srv["headers"] = tc.url, map[string]any{"Authorization": "Bearer $SANDBOXD_TOKEN"}
			}
			settings := map[string]any{
				"mcpServers": map[string]any{"sandbox": srv},
				"security": map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"},
					"folderTrust": map[string]any{"enabled": true}},
				"general":   map[string]any{"disableAutoUpdate": true, "disableUpdateNag": true},
				"privacy":   map[string]any{"usageStatisticsEnabled": false},
				"telemetry": map[string]any{"enabled": false},
			}
			for file, v := range map[string]any{"settings.json": settings, "trustedFolders.json": map[string]any{work: "TRUST_FOLDER"}} {
				b, _ := json.MarshalIndent(v, "", "  ")
				if err := os.WriteFile(filepath.Join(gdir, file), b, 0o600); err != nil {
					t.Error(err)
					return
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), silent+5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", js, "--approval-mode", "yolo", "-m", "gemini-2.5-pro", "-p", "Run the sandbox checks.")
			cmd.Dir = work
			cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin",
				"GEMINI_API_KEY=fake-key", "GOOGLE_GEMINI_BASE_URL=" + api.URL(), "SANDBOXD_TOKEN=" + tc.token,
				"GEMINI_CLI_NO_RELAUNCH=true", "NO_COLOR=1"}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			t.Logf("%s: gemini ran %s", name, time.Since(start).Round(time.Second))
			checkRun(t, name, p, want, err, out.String())
		}()
	}
	wg.Wait()
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left behind: %v", ids)
	}
	logBig(t, "gemini")
}

// logBig logs how much of the 1 MB output each model saw.
func logBig(t *testing.T, client string) {
	bigOutput.Range(func(k, v any) bool {
		if strings.HasPrefix(k.(string), client) {
			t.Logf("%s: of 1 MB of output the model saw %d bytes of stdout", k, v)
		}
		return true
	})
}
