package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestInspector: MCP Inspector's CLI (`@modelcontextprotocol/inspector`,
// pinned in test/clients/inspector with the Node.js it needs), as a new
// user tries a server (issue 23's first report): `--cli --method
// tools/call --tool-name run_code` of print(6*7) over stdio and over HTTP
// with the bearer token prints a result whose text part holds 42, not a
// pointer to the structured content; and an error reaches the text too.
func TestInspector(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot, "test", "clients", "inspector", "node_modules")
	nodeBin := filepath.Join(dir, ".bin", "node")
	cli := filepath.Join(dir, "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js")
	for _, f := range []string{nodeBin, cli} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("MCP Inspector is not installed (scripts/install-deps.sh runs npm ci in test/clients/inspector): %v", err)
		}
	}
	_, cases, _ := setup(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inspect := func(toolArgs ...string) (text string, isError bool) {
				t.Helper()
				args := append([]string{cli, "--cli", "--method", "tools/call"}, toolArgs...)
				if tc.stdio != nil {
					// After "--": the server's own --config is not the
					// Inspector's (which refuses it with a command).
					args = append(append(args, "--"), tc.stdio...)
				} else {
					// --header takes every argument after it: last.
					args = append(args, "--transport", "http", "--server-url", tc.url, "--header", "Authorization: Bearer "+tc.token)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, nodeBin, args...)
				home := t.TempDir()
				cmd.Env = append(os.Environ(), "HOME="+home, "MCP_CATALOG_PATH="+filepath.Join(home, "mcp.json"),
					"PATH="+filepath.Dir(nodeBin)+":"+os.Getenv("PATH"))
				// An isError result exits non-zero after printing it.
				out, err := cmd.Output()
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				var res struct {
					Content []struct {
						Type string `json:"type"`
						Text string `json:"text"`
					} `json:"content"`
					IsError bool `json:"isError"`
				}
				if derr := json.NewDecoder(bytes.NewReader(out)).Decode(&res); derr != nil || len(res.Content) == 0 {
					t.Fatalf("inspector %q: %v (output %v)\n%s\n%s", toolArgs, err, derr, out, stderr)
				}
				var b strings.Builder
				for _, c := range res.Content {
					if c.Type == "text" {
						b.WriteString(c.Text)
					}
				}
				return b.String(), res.IsError
			}
			text, isErr := inspect("--tool-name", "run_code", "--tool-arg", "language=python", "--tool-arg", "code=print(6*7)")
			if isErr || !strings.Contains(text, `"stdout":"42\n"`) {
				t.Fatalf("run_code print(6*7): the text parts do not hold 42 (error %v):\n%s", isErr, text)
			}
			t.Logf("run_code's text parts as the Inspector prints them:\n%s", text)
			text, isErr = inspect("--tool-name", "exec_command", "--tool-arg", "sandbox_id=sb-nonexistent", "--tool-arg", "command=echo hi")
			if !isErr || !strings.Contains(text, "not_found") || !strings.Contains(text, "sb-nonexistent") {
				t.Errorf("exec_command in a missing sandbox: error %v, text:\n%s", isErr, text)
			}
		})
	}
}
