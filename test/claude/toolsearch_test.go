package claude_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/fakemessages"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// searches are what a model looking for our tools types into Claude Code's
// tool search, and the tool that must come first (issue 23, item 5).
var searches = []struct{ query, want string }{
	{"run Python code", "run_code"},
	{"install a package", "packages_install"},
	{"open a port", "sandbox_expose_port"},
	{"run a shell command", "exec_command"},
	{"read a file", "file_read"},
	{"write a file", "file_write"},
	{"list files", "file_list"},
	{"delete a file", "file_delete"},
	{"download files as an archive", "files_export"},
	{"create a sandbox", "sandbox_create"},
	{"pause a sandbox", "sandbox_pause"},
	{"take a screenshot", "sandbox_screenshot"},
	{"check a background job", "job_status"},
	{"list languages", "languages_list"},
	{"build an image", "image_build"},
	{"allow network access to a host", "sandbox_network"},
	{"restore a snapshot", "sandbox_restore"},
	{"fix failing tests", "autofix"},
	{"run tests", "run_task"},
}

// TestToolSearch: with tool search on (Claude Code's default, which defers
// MCP tools behind its ToolSearch tool), the searches a model would type
// find the right tool first. The fake model sends each query and reads the
// tool references Claude Code answers.
func TestToolSearch(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t)
	d.Start()

	var mu sync.Mutex
	found := map[int][]string{} // search -> tools found, in order
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := fakemessages.ReadRequest(w, r)
		if !ok {
			return
		}
		main := false
		for _, tl := range req.Tools {
			main = main || tl.Name == "ToolSearch"
		}
		if !main {
			fakemessages.Answer(w, req.Stream, []map[string]any{{"type": "text", "text": "ok"}}, "end_turn")
			return
		}
		turn := 0
		for _, m := range req.Messages {
			var blocks []fakemessages.Block
			if json.Unmarshal(m.Content, &blocks) != nil {
				continue
			}
			for _, b := range blocks {
				if m.Role == "assistant" && b.Type == "tool_use" && strings.HasPrefix(b.ID, "toolu_q") {
					turn++
				}
				var n int
				if m.Role != "user" || b.Type != "tool_result" {
					continue
				}
				if _, err := fmt.Sscanf(b.ToolUseID, "toolu_q%d", &n); err != nil {
					continue
				}
				var refs []struct {
					Type     string `json:"type"`
					ToolName string `json:"tool_name"`
				}
				_ = json.Unmarshal(b.Content, &refs)
				var names []string
				for _, ref := range refs {
					if ref.Type == "tool_reference" {
						names = append(names, strings.TrimPrefix(ref.ToolName, "mcp__sandbox__"))
					}
				}
				mu.Lock()
				found[n] = names
				mu.Unlock()
			}
		}
		if turn >= len(searches) {
			fakemessages.Answer(w, req.Stream, []map[string]any{{"type": "text", "text": "Searched."}}, "end_turn")
			return
		}
		fakemessages.Answer(w, req.Stream, []map[string]any{{"type": "tool_use", "id": fmt.Sprintf("toolu_q%d", turn),
			"name": "ToolSearch", "input": map[string]any{"query": searches[turn].query, "max_results": 5}}}, "tool_use")
	}))
	defer api.Close()

	home := t.TempDir()
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"sandbox": map[string]any{
		"type": "stdio", "command": filepath.Join(d.Bin, "mcp-sandboxd"), "args": []string{"stdio", "--config", d.CfgPath}}}})
	cfgPath := filepath.Join(home, "mcp.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claudeBin(t), "-p", "Find the sandbox tools.",
		"--output-format", "stream-json", "--verbose",
		"--mcp-config", cfgPath, "--strict-mcp-config", "--dangerously-skip-permissions",
		"--model", "claude-sonnet-4-5", "--max-turns", "60")
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin",
		"ANTHROPIC_BASE_URL=" + api.URL, "ANTHROPIC_API_KEY=sk-ant-fake-key",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1",
		"ENABLE_TOOL_SEARCH=true", "IS_SANDBOX=1"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("claude: %v\n%.3000s", err, out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	hits := 0
	for i, s := range searches {
		got, ok := found[i]
		switch {
		case !ok:
			t.Errorf("search %q: no result reached the model", s.query)
		case len(got) == 0 || got[0] != s.want:
			t.Errorf("search %q: found %v, want %s first", s.query, got, s.want)
		default:
			hits++
		}
	}
	t.Logf("%d of %d searches found the right tool first", hits, len(searches))
}
