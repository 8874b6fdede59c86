package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }

// lineClient speaks newline-delimited JSON-RPC, like an MCP stdio client.
type lineClient struct {
	t      *testing.T
	w      io.Writer
	r      *bufio.Reader
	nextID int
	notifs []map[string]any
	// answer, when set, answers the server's requests (elicitation)
	// with its result; they are kept in notifs as well.
	answer func(req map[string]any) any
}

func newLineClient(t *testing.T, w io.Writer, r io.Reader) *lineClient {
	return &lineClient{t: t, w: w, r: bufio.NewReaderSize(r, 1<<20)}
}

func (c *lineClient) send(msg map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(msg)
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

// request sends a request and returns its result, collecting the
// notifications that come before it.
func (c *lineClient) request(method string, params any) map[string]any {
	c.t.Helper()
	c.nextID++
	id := c.nextID
	c.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			c.t.Fatalf("%s: read: %v", method, err)
		}
		var msg map[string]any
		if err := json.Unmarshal(line, &msg); err != nil {
			c.t.Fatalf("%s: not JSON on stdout: %q", method, line)
		}
		if _, isResp := msg["id"]; !isResp || msg["method"] != nil {
			c.notifs = append(c.notifs, msg)
			if _, isReq := msg["id"]; isReq && c.answer != nil {
				c.send(map[string]any{"jsonrpc": "2.0", "id": msg["id"], "result": c.answer(msg)})
			}
			continue
		}
		if msg["id"] != float64(id) {
			c.t.Fatalf("%s: answer for id %v, want %d", method, msg["id"], id)
		}
		if msg["error"] != nil {
			c.t.Fatalf("%s: error %v", method, msg["error"])
		}
		return msg["result"].(map[string]any)
	}
}

func (c *lineClient) initialize() map[string]any {
	c.t.Helper()
	res := c.request("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "line-client", "version": "0"}})
	c.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return res
}

func (c *lineClient) callTool(name string, args any) map[string]any {
	c.t.Helper()
	return c.request("tools/call", map[string]any{"name": name, "arguments": args})
}

// TestBridge carries a stdio session to the HTTP handler on a unix socket,
// as `mcp-sandboxd stdio` does next to a running daemon: tools, progress
// notifications, errors, and the end of the session.
func TestBridge(t *testing.T) {
	e := newEngine(t)
	sock := filepath.Join(e.Config().Paths.RunDir, "mcp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", NewHandler(e, Options{Log: testenv.Logger(t), OnSessionEnd: config.SessionEndTerminate, Replays: e.Replays()}))
	hs := &http.Server{Handler: mux}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	go func() { done <- Bridge(context.Background(), dial, inR, outW, testenv.Logger(t)) }()
	c := newLineClient(t, inW, outR)
	init := c.initialize()
	if init["protocolVersion"] != "2025-11-25" || !strings.Contains(init["instructions"].(string), "languages_list") {
		t.Errorf("initialize = %v", init)
	}
	tools := c.request("tools/list", map[string]any{})["tools"].([]any)
	if len(tools) != len(allTools) {
		t.Errorf("%d tools over the bridge", len(tools))
	}
	sb := c.callTool("sandbox_create", map[string]any{"language": "shell"})["structuredContent"].(map[string]any)
	id := sb["sandbox_id"].(string)
	labels, _ := sb["labels"].(map[string]any)
	if labels[SessionLabel] == nil || labels[SessionLabel] == "" {
		t.Errorf("no session label over HTTP: %v", sb)
	}

	res := c.request("tools/call", map[string]any{"name": "exec_command",
		"arguments": map[string]any{"sandbox_id": id, "command": "for i in $(seq 20); do echo line $i; sleep 0.1; done"},
		"_meta":     map[string]any{"progressToken": "tok"}})
	if res["isError"] == true {
		t.Fatalf("exec: %v", res)
	}
	n := 0
	for _, m := range c.notifs {
		if m["method"] == string(mcp.MethodNotificationProgress) {
			n++
		}
	}
	if n < 10 {
		t.Errorf("%d progress notifications over the bridge, want >= 10", n)
	}
	res = c.callTool("sandbox_get", map[string]any{"sandbox_id": "sb-000000000000"})
	if res["isError"] != true || !strings.Contains(res["content"].([]any)[0].(map[string]any)["text"].(string), "not_found") {
		t.Errorf("unknown sandbox over the bridge: %v", res)
	}

	// The end of the input ends the session: its sandbox goes.
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("bridge did not return at the end of its input")
	}
	if d, err := e.GetSandbox(context.Background(), id); err != nil || d.State != "terminated" {
		t.Errorf("session's sandbox after the session ended: %+v %v", d, err)
	}
}
