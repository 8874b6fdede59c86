// Package conformance_test runs the official MCP conformance suite (npm
// @modelcontextprotocol/conformance, pinned in package.json, on a pinned
// Node.js from npm; scripts/install-deps.sh installs both) against
// mcp-sandboxd's MCP endpoint over streamable HTTP.
package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// applicable are the suite's server scenarios that apply to mcp-sandboxd:
// the lifecycle, tools and transport ones. The rest test features this
// server does not offer (and does not declare in its capabilities):
// logging, completions, resources, prompts, sampling and elicitation, or
// call the fixed tools of the suite's reference server (test_simple_text,
// test_image_content, ...), which a real server does not have.
var applicable = []string{
	"server-initialize",
	"ping",
	"tools-list",
	"server-sse-polling",
	"server-sse-multiple-streams",
	"dns-rebinding-protection",
}

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(testenv.RepoRoot, "test", "conformance")
	nodeBin := filepath.Join(dir, "node_modules", ".bin", "node")
	suite := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, f := range []string{nodeBin, suite} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the conformance suite is not installed (scripts/install-deps.sh runs npm ci in test/conformance): %v", err)
		}
	}
	cfg := testenv.Config(t, "conf")
	testenv.EnsureImages(t, "shell")
	e, err := engine.New(context.Background(), cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(); testenv.AssertNoLeftovers(t, cfg) })
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.NewHandler(e, mcpserver.Options{Log: testenv.Logger(t)}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(l)
	t.Cleanup(func() { _ = hs.Close() })
	url := "http://" + l.Addr().String() + "/mcp"

	scenarios := applicable
	if v := os.Getenv("SANDBOXD_CONFORMANCE_SCENARIOS"); v != "" {
		// To look at the others: a comma-separated list.
		scenarios = strings.Split(v, ",")
	}
	for _, sc := range scenarios {
		t.Run(sc, func(t *testing.T) {
			out := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, nodeBin, suite, "server", "--url", url, "--scenario", sc, "-o", out)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(nodeBin)+":"+os.Getenv("PATH"))
			var stdout bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stdout
			runErr := cmd.Run()
			checks := readChecks(t, out)
			if len(checks) == 0 {
				t.Fatalf("no checks ran (%v):\n%s", runErr, stdout.String())
			}
			for _, c := range checks {
				switch c.Status {
				case "SUCCESS", "INFO":
				default:
					t.Errorf("%s: %s %s: %s", c.ID, c.Status, c.Description, c.ErrorMessage)
				}
			}
			if runErr != nil {
				t.Errorf("conformance %s: %v\n%s", sc, runErr, stdout.String())
			}
			t.Logf("%s: %d checks", sc, len(checks))
		})
	}
}

type check struct {
	ID           string `json:"id"`
	Status       string `json:"status"`
	Description  string `json:"description"`
	ErrorMessage string `json:"errorMessage"`
}

// readChecks reads every checks.json the suite wrote under dir.
func readChecks(t *testing.T, dir string) []check {
	var all []check
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "checks.json") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		var cs []check
		if json.Unmarshal(data, &cs) != nil {
			t.Errorf("%s: not a list of checks", path)
		}
		all = append(all, cs...)
		return nil
	})
	return all
}
