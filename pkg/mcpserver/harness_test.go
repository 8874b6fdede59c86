package mcpserver

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/engineenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init: libcontainer
// re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

// newEngine is an engine on private state with the shell, python and c
// images; every sandbox is terminated and leftovers checked at the end.
func newEngine(t *testing.T, tweak ...func(*config.Config)) *engine.Engine {
	t.Helper()
	cfg := testenv.Config(t, "mcp")
	testenv.EnsureImages(t, "shell", "python", "c")
	for _, f := range tweak {
		f(cfg)
	}
	return engineenv.New(t, cfg)
}

// mcpClient is an initialized streamable-HTTP client that records the
// notifications it receives.
type mcpClient struct {
	*client.Client
	t *testing.T

	mu     sync.Mutex
	notifs []mcp.JSONRPCNotification
}

func newClient(t *testing.T, e Engine, opt Options) *mcpClient {
	t.Helper()
	if opt.Log == nil {
		opt.Log = testenv.Logger(t)
	}
	// The daemon wires run replay from the engine's pipeline (serve.go).
	if re, ok := e.(*engine.Engine); ok && opt.Replays == nil {
		opt.Replays = re.Replays()
	}
	// Over streamable HTTP, as clients meet it: progress travels on the
	// request's own stream (requestStream), which the in-process transport
	// does not have.
	hs := httptest.NewServer(NewHandler(e, opt))
	t.Cleanup(hs.Close)
	c, err := client.NewStreamableHttpClient(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	mc := &mcpClient{Client: c, t: t}
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		mc.mu.Lock()
		mc.notifs = append(mc.notifs, n)
		mc.mu.Unlock()
	})
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "mcpserver-test", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return mc
}

// call calls a tool; a protocol error fails the test.
func (c *mcpClient) call(name string, args any, meta *mcp.Meta) *mcp.CallToolResult {
	c.t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	req.Params.Meta = meta
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := c.CallTool(ctx, req)
	if err != nil {
		c.t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured content.
func ok[T any](c *mcpClient, name string, args any) T {
	c.t.Helper()
	res := c.call(name, args, nil)
	if res.IsError {
		c.t.Fatalf("%s(%v): error result %s", name, args, text(res))
	}
	var out T
	decodeStructured(c.t, res, &out)
	return out
}

func decodeStructured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	// Clients that read only text (Gemini CLI, MCP Inspector) find the
	// same structured content serialized in a text block.
	if !hasJSONText(res, b) {
		t.Errorf("no text block carries the structured content %.300s", b)
	}
}

// viewBytes is the size of a result as a client hands it to its model, the
// larger of the two views: the structured content as JSON (Claude Code,
// Codex CLI) and the text blocks (Gemini CLI, MCP Inspector).
func viewBytes(res *mcp.CallToolResult) int {
	structured, _ := json.Marshal(res.StructuredContent)
	texts := 0
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			texts += len(tc.Text)
		}
	}
	return max(len(structured), texts)
}

// wireBytes is the size of a result on the wire: both views, the text one
// JSON-escaped again (a quote or newline costs a byte more), so up to
// about three times the budget.
func wireBytes(res *mcp.CallToolResult) int {
	b, _ := json.Marshal(res)
	return len(b)
}

// hasJSONText reports whether a text block of res is the JSON document
// want (compared as values, not bytes).
func hasJSONText(res *mcp.CallToolResult, want []byte) bool {
	var w any
	if json.Unmarshal(want, &w) != nil {
		return false
	}
	for _, c := range res.Content {
		tc, ok := c.(mcp.TextContent)
		if !ok {
			continue
		}
		var got any
		if json.Unmarshal([]byte(tc.Text), &got) == nil && reflect.DeepEqual(got, w) {
			return true
		}
	}
	return false
}

// errCode returns the taxonomy code of an error result ("" when the call
// succeeded), checking that both parts carry it.
func errCode(t *testing.T, res *mcp.CallToolResult) (string, string) {
	t.Helper()
	if !res.IsError {
		return "", ""
	}
	if res.StructuredContent != nil {
		t.Errorf("error result with structured content %v (clients validate it against the output schema)", res.StructuredContent)
	}
	// "code: message", then the error object: the model reads the message
	// first, and the text is no JSON document (Gemini CLI would take one
	// for structured content and check it against the output schema).
	txt := text(res)
	if json.Valid([]byte(txt)) {
		t.Errorf("error text %q is a JSON document", txt)
	}
	// The message may span lines; the error object is the last line.
	i := strings.LastIndexByte(txt, '\n')
	first, rest := txt[:max(i, 0)], txt[i+1:]
	var body struct {
		Error apitypes.ErrorBody `json:"error"`
	}
	if err := json.Unmarshal([]byte(rest), &body); err != nil || body.Error.Code == "" {
		t.Errorf("text part %q does not carry the error: %v", txt, err)
	}
	if first != body.Error.Code+": "+body.Error.Message {
		t.Errorf("error text before the error object %q is not %q", first, body.Error.Code+": "+body.Error.Message)
	}
	return body.Error.Code, body.Error.Message
}

func text(res *mcp.CallToolResult) string {
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			return tc.Text
		}
	}
	return ""
}

func (c *mcpClient) notifications() []mcp.JSONRPCNotification {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]mcp.JSONRPCNotification(nil), c.notifs...)
}
