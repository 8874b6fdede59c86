// Package claude_test drives the real Claude Code CLI (npm
// @anthropic-ai/claude-code, pinned in package.json and installed by
// scripts/install-deps.sh) against mcp-sandboxd, with ANTHROPIC_BASE_URL
// pointing at a fake Messages API on loopback (fakeapi_test.go) that plays
// the model: it calls the MCP tools in a fixed script and checks every
// tool_result Claude Code hands back. Over stdio with a daemon, stdio
// without one, HTTP, and stdio as a non-root member of the socket's group.
package claude_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// claudeBin is Claude Code's native binary from the pinned npm package
// (the package's own postinstall only copies this file over a stub).
func claudeBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(testenv.RepoRoot, "test", "claude", "node_modules", "@anthropic-ai", "claude-code-linux-x64", "claude")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Claude Code is not installed (scripts/install-deps.sh runs npm ci in test/claude): %v", err)
	}
	return bin
}

// modelSees is how much of the 1 MB output the model saw (for the log).
var modelSees atomic.Int64

var sandboxIDRe = regexp.MustCompile(`sb-[0-9a-f]{12}`)

// script is the session every transport runs: 20 tool calls in a row.
func script(silent time.Duration) []step {
	has := func(subs ...string) func(*vars, string) string {
		return func(_ *vars, text string) string {
			for _, s := range subs {
				if !strings.Contains(text, s) {
					return fmt.Sprintf("no %q", s)
				}
			}
			return ""
		}
	}
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
	s := []step{
		{tool: "languages_list", input: fixed(map[string]any{}), check: has(`"python"`, `"shell"`)},
		{tool: "run_code", input: fixed(map[string]any{"language": "python", "code": "print(6 * 7)\n"}), check: has(`"stdout":"42\n"`, `"success":true`)},
		{tool: "sandbox_create", input: fixed(map[string]any{"language": "shell"}), check: func(v *vars, text string) string {
			v.sandboxID = sandboxIDRe.FindString(text)
			if v.sandboxID == "" || !strings.Contains(text, `"state":"ready"`) {
				return "no ready sandbox id"
			}
			return ""
		}},
		{tool: "file_write", input: sb(map[string]any{"path": "/workspace/hello.txt", "content": "hello from claude\n"}), check: has("/workspace/hello.txt")},
		{tool: "exec_command", input: sb(map[string]any{"command": "cat /workspace/hello.txt"}), check: has(`"stdout":"hello from claude\n"`, `"exit_code":0`)},
		{tool: "exec_command", input: sb(map[string]any{"command": fmt.Sprintf("sleep %d; echo woke", int(silent.Seconds())), "timeout_seconds": silent.Seconds() + 60}),
			check: has(`"stdout":"woke\n"`, `"exit_code":0`)},
		{tool: "exec_command", input: sb(map[string]any{"command": "echo FIRST; seq 1 200000 | head -c 1000000; echo; echo LAST"}),
			check: func(_ *vars, text string) string {
				var out struct {
					Stdout string `json:"stdout"`
				}
				// Claude Code may append <system-reminder> text after the
				// structured content: read the first JSON value.
				if err := json.NewDecoder(strings.NewReader(text)).Decode(&out); err != nil {
					return "result is not the structured content: " + err.Error()
				}
				if len(out.Stdout) < 40<<10 || !strings.HasPrefix(out.Stdout, "FIRST\n") || !strings.HasSuffix(out.Stdout, "LAST\n") || !strings.Contains(out.Stdout, "bytes cut here") {
					return fmt.Sprintf("1 MB output: the model sees %d bytes of it", len(out.Stdout))
				}
				modelSees.Store(int64(len(out.Stdout)))
				return ""
			}},
	}
	for i := len(s); i < 19; i++ {
		s = append(s, step{tool: "exec_command", input: sb(map[string]any{"command": fmt.Sprintf("echo turn %d", i+1)}),
			check: has(fmt.Sprintf(`"stdout":"turn %d\n"`, i+1))})
	}
	s = append(s, step{tool: "sandbox_terminate", input: sb(nil), check: has(`"state":"terminated"`)})
	return s
}

// session is one Claude Code run against one MCP server configuration.
type session struct {
	name    string
	server  map[string]any // the mcpServers entry
	env     []string       // extra environment
	cred    *syscall.Credential
	home    string
	checked int
}

// runClaude runs `claude -p` headless with the script and returns the
// problems the fake model saw.
func runClaude(t *testing.T, s *session, silent time.Duration) {
	sc := script(silent)
	api := newFakeAPI(t, sc)
	if s.home == "" {
		s.home = t.TempDir()
	}
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"sandbox": s.server}})
	cfgPath := filepath.Join(s.home, "mcp.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claudeBin(t), "-p", "Run the sandbox checks.",
		"--output-format", "stream-json", "--verbose",
		"--mcp-config", cfgPath, "--strict-mcp-config",
		"--allowedTools", "mcp__sandbox",
		"--dangerously-skip-permissions",
		"--model", "claude-sonnet-4-5", "--max-turns", "60")
	cmd.Dir = s.home
	cmd.Env = append([]string{
		"HOME=" + s.home, "PATH=/usr/local/bin:/usr/bin:/bin",
		"ANTHROPIC_BASE_URL=" + api.URL(), "ANTHROPIC_API_KEY=sk-ant-fake-key",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1",
		"ENABLE_TOOL_SEARCH=false", "MCP_TIMEOUT=60000",
		// Claude Code refuses --dangerously-skip-permissions as root unless
		// it is told it runs in a sandbox (this test's throw-away HOME).
		"IS_SANDBOX=1",
	}, s.env...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	checked, problems, results := api.report()
	s.checked = checked
	t.Logf("%s: claude ran %s, %d tool results checked", s.name, time.Since(start).Round(time.Second), checked)
	if err != nil {
		t.Errorf("%s: claude: %v\nstderr: %s", s.name, err, stderr.String())
	}
	for _, p := range problems {
		t.Errorf("%s: %s", s.name, p)
	}
	if checked != len(sc) {
		t.Errorf("%s: %d of %d tool results reached the model", s.name, checked, len(sc))
	}
	// The stream's init message says whether the server connected, and the
	// final result whether the run ended well.
	sawConnected := false
	sc2 := bufio.NewScanner(&stdout)
	sc2.Buffer(make([]byte, 1<<20), 64<<20)
	for sc2.Scan() {
		var m struct {
			Type       string `json:"type"`
			Subtype    string `json:"subtype"`
			IsError    bool   `json:"is_error"`
			MCPServers []struct {
				Name, Status string
			} `json:"mcp_servers"`
		}
		if json.Unmarshal(sc2.Bytes(), &m) != nil {
			continue
		}
		if m.Type == "system" && m.Subtype == "init" {
			for _, srv := range m.MCPServers {
				if srv.Name == "sandbox" && srv.Status == "connected" {
					sawConnected = true
				}
			}
		}
		if m.Type == "result" && (m.IsError || m.Subtype != "success") {
			t.Errorf("%s: run ended %s: %.1000s", s.name, m.Subtype, sc2.Text())
		}
	}
	if !sawConnected {
		t.Errorf("%s: the MCP server did not connect\n%.4000s", s.name, stdout.String())
	}
	if t.Failed() && len(results) > 0 {
		t.Logf("%s: last tool result: %.2000s", s.name, results[len(results)-1])
	}
}

// TestClaudeCode runs the script over every transport at once.
func TestClaudeCode(t *testing.T) {
	testenv.RequireRoot(t)
	claudeBin(t)
	silent := 75 * time.Second
	if v, err := strconv.Atoi(os.Getenv("SANDBOXD_CLAUDE_SILENT_S")); err == nil && v > 0 {
		silent = time.Duration(v) * time.Second
	}

	// The daemon, its socket owned by a throw-away group with a throw-away
	// member who is not root.
	group, uid, gid := tempUser(t)
	d := testenv.NewDaemon(t, "python")
	d.Config.Server.SocketGroup = group
	d.Config.Sandbox.MaxSandboxes = 32
	writeConfig(t, d.CfgPath, d.Config)
	d.Start()
	st, err := os.Stat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); int(sys.Gid) != gid || st.Mode().Perm() != 0o660 {
		t.Errorf("socket %v gid %d, want 0660 gid %d", st.Mode(), sys.Gid, gid)
	}

	// Without a daemon: a second configuration on its own state, as root.
	solo := testenv.NewDaemon(t)
	solo.Config.Server.MCPOnSessionEnd = config.SessionEndTerminate
	// It runs beside d, and a live daemon's subnet is its own (pkg/hostclaim).
	solo.Config.Network.Subnet = "10.89.0.0/16"
	writeConfig(t, solo.CfgPath, solo.Config)

	bin := filepath.Join(d.Bin, "mcp-sandboxd")
	clientLog := filepath.Join(t.TempDir(), "claude-to-server.jsonl")
	userHome := filepath.Join(sharedDir(t), "home")
	if err := os.Mkdir(userHome, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userHome, uid, gid); err != nil {
		t.Fatal(err)
	}
	sessions := []*session{
		// What Claude Code writes to this server is kept (tee), to see which
		// protocol revision it settled on over stdio.
		{name: "stdio-daemon", server: map[string]any{"type": "stdio", "command": "/bin/sh",
			"args": []string{"-c", `tee "$1" | "$2" stdio --config "$3"`, "sh", clientLog, bin, d.CfgPath}}},
		{name: "stdio-no-daemon", server: map[string]any{"type": "stdio", "command": bin, "args": []string{"stdio", "--config", solo.CfgPath}}},
		{name: "http", server: map[string]any{"type": "http", "url": "http://" + d.HTTPAddr + "/mcp",
			"headers": map[string]any{"Authorization": "Bearer ${SANDBOXD_TOKEN}"}},
			env: []string{"SANDBOXD_TOKEN=" + d.Token()}},
		{name: "stdio-non-root", home: userHome, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
			server: map[string]any{"type": "stdio", "command": bin, "args": []string{"stdio", "--config", sharedCopy(t, d.CfgPath)}}},
	}
	var wg sync.WaitGroup
	defer func() {
		// Claude Code first tries 2026-07-28 (no initialize); over stdio it
		// must not have had to fall back to an initialize handshake.
		data, err := os.ReadFile(clientLog)
		if err != nil {
			t.Fatal(err)
		}
		calls := strings.Count(string(data), `"method":"tools/call"`)
		modern := strings.Count(string(data), `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`)
		if strings.Contains(string(data), `"method":"initialize"`) || calls < 20 || modern < calls {
			t.Errorf("stdio: Claude Code sent %d tool calls, %d messages on 2026-07-28, initialize: %v", calls, modern, strings.Contains(string(data), `"method":"initialize"`))
		}
	}()
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runClaude(t, s, silent)
		}()
	}
	wg.Wait()
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left behind: %v", ids)
	}
	t.Logf("of 1 MB of output the model saw %d bytes", modelSees.Load())
}

// TestStdioRefusesWithoutDaemon: a user who is not root, with no daemon,
// gets a JSON-RPC error that says what to do, on stdout where the client
// reads it.
func TestStdioRefusesWithoutDaemon(t *testing.T) {
	testenv.RequireRoot(t)
	_, uid, gid := tempUser(t)
	solo := testenv.NewDaemon(t)
	cmd := exec.Command(filepath.Join(solo.Bin, "mcp-sandboxd"), "stdio", "--config", sharedCopy(t, solo.CfgPath))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}` + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("stdio: %v\n%s", err, stderr.String())
	}
	var m struct {
		ID    int `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil || m.ID != 1 ||
		!strings.Contains(m.Error.Message, "needs the mcp-sandboxd daemon or root") || !strings.Contains(m.Error.Message, "systemctl start mcp-sandboxd") {
		t.Errorf("answer %q (%v)", stdout.String(), err)
	}
	if strings.Count(strings.TrimSpace(stderr.String()), "\n") > 0 {
		t.Errorf("stderr says more than one line: %q", stderr.String())
	}
}

// sharedDir is a temporary directory others may read (t.TempDir's parent
// is root's alone).
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbxclaude-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sharedCopy copies a file into a sharedDir, readable by everyone.
func sharedCopy(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(sharedDir(t), filepath.Base(path))
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestStdioSecondClientWithoutDaemon: without a daemon root's first stdio
// client runs the engine in-process; a second one at the same time gets a
// JSON-RPC error saying to start the daemon, not a silent death.
func TestStdioSecondClientWithoutDaemon(t *testing.T) {
	testenv.RequireRoot(t)
	solo := testenv.NewDaemon(t)
	bin := filepath.Join(solo.Bin, "mcp-sandboxd")
	first := exec.Command(bin, "stdio", "--config", solo.CfgPath)
	in, err := first.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var firstErr bytes.Buffer
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		in.Close()
		_ = first.Wait()
		// stdio logs warnings and errors only: a good session says nothing
		// (Claude Code shows every stderr line as an error).
		if firstErr.Len() > 0 {
			t.Errorf("first client's stderr: %s", firstErr.String())
		}
	}()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}` + "\n"
	if _, err := in.Write([]byte(init)); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(out)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(line, `"result"`) {
		t.Fatalf("first client: %q %v", line, err)
	}
	call := `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"languages_list","arguments":{}}}` + "\n"
	if _, err := in.Write([]byte(call)); err != nil {
		t.Fatal(err)
	}
	if line, err = rd.ReadString('\n'); err != nil || !strings.Contains(line, `"shell"`) {
		t.Fatalf("first client: languages_list: %.300q %v", line, err)
	}

	second := exec.Command(bin, "stdio", "--config", solo.CfgPath)
	second.Stdin = strings.NewReader(init)
	got, err := second.Output()
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	if !strings.Contains(string(got), `"error"`) || !strings.Contains(string(got), "one client at a time") || !strings.Contains(string(got), "Start the daemon") {
		t.Errorf("second client got %q", got)
	}
}

func writeConfig(t *testing.T, path string, c *config.Config) {
	t.Helper()
	data, err := config.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// tempUser creates a system group and a system user in it, both removed at
// the end of the test.
func tempUser(t *testing.T) (group string, uid, gid int) {
	t.Helper()
	name := "sbxt" + testenv.RandHex(4)
	if out, err := exec.Command("groupadd", "--system", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("groupdel", name).Run() })
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--gid", name, "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return name, uid, gid
}
