package remote

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
)

// The gateway's /mcp: the real MCP server over this engine, behind the
// gateway's bearer check, its tool calls reaching the node as the key's
// principal; no key, no session.
func TestGatewayMCPEndpoint(t *testing.T) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	g := gateway.New(gateway.Options{
		Discovery: gateway.Static{{Name: a.name, URL: a.srv.URL}, {Name: b.name, URL: b.srv.URL}},
		Auth:      keyAuth{}, Secret: secret, NodeTimeout: 2 * time.Second,
		MCP: func(g *gateway.Gateway) http.Handler {
			return mcpserver.NewHandler(New(g, config.Default()), mcpserver.Options{})
		},
	})
	hs := httptest.NewServer(g)
	t.Cleanup(hs.Close)

	res, err := http.Post(hs.URL+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("/mcp without a key: %d, want 401", res.StatusCode)
	}

	c, err := client.NewStreamableHttpClient(hs.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer alice-key"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "gateway-test", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	id := b.seed("alice", nil)
	req := mcp.CallToolRequest{}
	req.Params.Name = "exec_command"
	req.Params.Arguments = map[string]any{"sandbox_id": id, "command": "echo hi"}
	out, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	sc, _ := out.StructuredContent.(map[string]any)
	if out.IsError || sc["stdout"] != "on node-b\n" || sc["exit_code"] != float64(3) {
		t.Errorf("exec_command through the gateway: isError %v, %v", out.IsError, out.StructuredContent)
	}
	calls := b.callsTo("POST", "/v1/sandboxes/"+id+"/exec")
	if len(calls) != 1 || calls[0].p == nil || *calls[0].p != alice || calls[0].auth != "" {
		t.Errorf("node-b saw the exec as %+v, want alice's principal and no key", calls)
	}
	// A node's error is the tool's error result, code and message kept.
	req.Params.Arguments = map[string]any{"sandbox_id": a.id(99), "command": "true"}
	out, err = c.CallTool(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if txt := out.Content[0].(mcp.TextContent).Text; !out.IsError || !strings.HasPrefix(txt, `not_found: sandbox_id: no sandbox "`+a.id(99)+`"`) {
		t.Errorf("exec in a sandbox node-a does not have: isError %v, %q", out.IsError, txt)
	}
}
