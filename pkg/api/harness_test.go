package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init: libcontainer
// re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

var (
	repoRoot = func() string {
		_, file, _, _ := goruntime.Caller(0)
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}()
	agentOnce   sync.Once
	agentBinary string
	agentErr    error
	imageOnce   sync.Once
	imageErr    error
)

// requireRoot skips a test that needs root, unless SANDBOXD_INTEGRATION=1
// (make test), under which a skip would hide a failure.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("SANDBOXD_INTEGRATION") == "1" {
		t.Fatal("integration test needs root (SANDBOXD_INTEGRATION=1 forbids skipping)")
	}
	t.Skip("integration test needs root")
}

// agentPath returns a static sandbox-agent: $SANDBOXD_AGENT or one built
// once into a temp dir.
func agentPath(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		if p := os.Getenv("SANDBOXD_AGENT"); p != "" {
			agentBinary = p
			return
		}
		dir, err := os.MkdirTemp("", "sbx-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentBinary = filepath.Join(dir, "sandbox-agent")
		cmd := exec.Command("go", "build", "-o", agentBinary, "./cmd/sandbox-agent")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBinary
}

// testImagesDir is shared across test runs and packages: images are
// content-addressed, so an unchanged recipe is reused.
func testImagesDir() string {
	if d := os.Getenv("SANDBOXD_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-images"
}

// ensureShellImage builds the shell image once per test binary.
func ensureShellImage(t testing.TB) {
	t.Helper()
	imageOnce.Do(func() {
		st, err := image.OpenStore(testImagesDir())
		if err != nil {
			imageErr = err
			return
		}
		r, err := image.LoadRecipe(filepath.Join(repoRoot, "rootfs", "shell.yaml"))
		if err != nil {
			imageErr = err
			return
		}
		b := &image.Builder{Store: st, Suite: "bookworm", Log: io.Discard}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		_, imageErr = b.Ensure(ctx, r)
	})
	if imageErr != nil {
		t.Fatalf("build shell image: %v", imageErr)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testToken is the bearer token of the test's TCP server.
const testToken = "test-token-0123456789abcdef"

// testServer is the API over a private engine (own state and run dirs, own
// cgroup parent, the shared image cache), served like the daemon does: on a
// unix socket without authentication and on TCP behind testToken.
type testServer struct {
	engine *engine.Engine
	http   *httptest.Server // TCP, token required
	socket string           // unix socket, no token
	unix   *client.Client
	tcp    *client.Client
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	requireRoot(t)
	ensureShellImage(t)
	cfg := config.Default()
	// Keep the run dir short: unix socket paths are limited to 108 bytes.
	runDir, err := os.MkdirTemp("/run", "sbxa-")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.RunDir = runDir
	cfg.Paths.ImagesDir = testImagesDir()
	cfg.Paths.RecipesDir = filepath.Join(repoRoot, "rootfs")
	cfg.Paths.SeccompDir = filepath.Join(repoRoot, "seccomp-profiles")
	cfg.Paths.AgentPath = agentPath(t)
	cfg.Sandbox.CgroupParent = "/mcp-sandboxd-apitest-" + randHex(4)
	cfg.Sandbox.Memory = 256 << 20
	cfg.Sandbox.Disk = 128 << 20
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e, err := engine.New(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{engine: e, socket: filepath.Join(runDir, "api.sock")}
	ts.http = httptest.NewServer(NewHandler(e, Options{Token: testToken, Log: log}))
	l, err := net.Listen("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	unixSrv := &http.Server{Handler: NewHandler(e, Options{Log: log})}
	go func() { _ = unixSrv.Serve(l) }()
	if ts.unix, err = client.New(client.Options{Socket: ts.socket}); err != nil {
		t.Fatal(err)
	}
	if ts.tcp, err = client.New(client.Options{URL: ts.http.URL, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		ts.unix.Close()
		ts.tcp.Close()
		ts.http.Close()
		_ = unixSrv.Close()
		live, err := e.ListSandboxes(ctx, "")
		if err != nil {
			t.Errorf("cleanup: list sandboxes: %v", err)
		}
		for _, s := range live {
			if _, err := e.TerminateSandbox(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		_ = e.Close()
		removeCgroupParent(t, cfg.Sandbox.CgroupParent)
		_ = os.RemoveAll(runDir)
	})
	return ts
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func removeCgroupParent(t *testing.T, parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(parent, "/")))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(parent, "/")))
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent %s: %v", d, err)
		}
	}
}

// request sends a raw request to the TCP server with the token (unless
// token is false) and returns the response; the body is closed at cleanup.
func (ts *testServer) request(t *testing.T, method, path string, body io.Reader, token bool) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, ts.http.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token {
		req.Header.Set("Authorization", "Bearer "+testToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// createSandbox creates a shell sandbox through the API.
func (ts *testServer) createSandbox(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := ts.unix.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	return sb.ID
}
