package api

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/engineenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init: libcontainer
// re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// testToken is the bearer token of the test's TCP server.
const testToken = "test-token-0123456789abcdef"

// testServer is the API over a private engine (own state and run dirs, own
// cgroup parent, the shared image cache), served like the daemon does: on a
// unix socket without authentication and on TCP behind testToken.
type testServer struct {
	engine *engine.Engine
	ui     *UIAuth          // web editor logins, shared by both listeners
	http   *httptest.Server // TCP, token or session required
	socket string           // unix socket, no token
	unix   *client.Client
	tcp    *client.Client
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	cfg := testenv.Config(t, "apitest")
	testenv.EnsureImages(t, "shell")
	log := testenv.Logger(t)
	e := engineenv.New(t, cfg)
	// Registered after the engine's cleanup, so run before it: the
	// listeners close first.
	ts := serveTestServer(t, e, filepath.Join(cfg.Paths.RunDir, "api.sock"), log)
	ts.engine = e
	return ts
}

// serveTestServer serves the API over e as the daemon does: on a unix
// socket at socket without authentication, and on TCP behind testToken or
// a web editor session. Its listeners close at cleanup (before the
// cleanups registered earlier: the engine's).
func serveTestServer(t *testing.T, e Engine, socket string, log *slog.Logger) *testServer {
	t.Helper()
	ts := &testServer{socket: socket}
	ts.http = httptest.NewUnstartedServer(nil)
	ts.ui = NewUIAuth(UIAuthOptions{BaseURL: "http://" + ts.http.Listener.Addr().String()})
	ts.http.Config.Handler = NewHandler(e, Options{Token: testToken, Log: log, UI: ts.ui})
	ts.http.Start()
	l, err := net.Listen("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	unixSrv := &http.Server{Handler: NewHandler(e, Options{Log: log, UI: ts.ui})}
	go func() { _ = unixSrv.Serve(l) }()
	if ts.unix, err = client.New(client.Options{Socket: ts.socket}); err != nil {
		t.Fatal(err)
	}
	if ts.tcp, err = client.New(client.Options{URL: ts.http.URL, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ts.unix.Close()
		ts.tcp.Close()
		ts.http.Close()
		_ = unixSrv.Close()
	})
	return ts
}

// newFakeTestServer is a testServer over a fake engine (fake_test.go):
// for the tests of what the handlers do before and around the engine
// (authentication, the web editor's sessions), which need no root.
func newFakeTestServer(t *testing.T, f *fakeEngine) *testServer {
	t.Helper()
	return serveTestServer(t, f, filepath.Join(t.TempDir(), "api.sock"), testenv.Logger(t))
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
