package mcpserver

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// The client provider over MCP: autofix answers needs_fix with a prompt,
// autofix_submit runs the client's fixes, autofix_status follows.
func TestAutofixClientTools(t *testing.T) {
	testenv.RequireRoot(t)
	e := newEngine(t)
	c := newClient(t, e, Options{})
	res := ok[autofixOut](c, "autofix", map[string]any{"language": "python", "code": "print(undefined_name)\n"})
	if res.Status != apitypes.AutofixNeedsFix || res.Provider != "client" || !strings.Contains(res.Prompt, "NameError") || res.ExpiresAt == nil {
		t.Fatalf("autofix: %+v", res)
	}
	st := ok[autofixOut](c, "autofix_status", map[string]any{"autofix_id": res.AutofixID})
	if st.Status != apitypes.AutofixNeedsFix || st.Attempts != 1 || !strings.Contains(st.History[0].ErrorExcerpt, "NameError") {
		t.Fatalf("autofix_status: %+v", st)
	}
	// An answer that patches outside /workspace is refused, and recorded.
	res = ok[autofixOut](c, "autofix_submit", map[string]any{"autofix_id": res.AutofixID,
		"answer": "--- /dev/null\n+++ /etc/evil\n@@ -0,0 +1 @@\n+x\n"})
	if res.Status != apitypes.AutofixNeedsFix || res.Attempts != 1 || !strings.Contains(res.History[0].Refused, "outside /workspace") ||
		!strings.Contains(res.Prompt, "could not be applied") {
		t.Fatalf("refused submit: %+v", res)
	}
	out := c.call("autofix_submit", map[string]any{"autofix_id": res.AutofixID, "code": "print('fixed')\n"}, nil)
	if out.IsError {
		t.Fatalf("autofix_submit: %s", text(out))
	}
	var fixed autofixOut
	decodeStructured(t, out, &fixed)
	if fixed.Status != apitypes.AutofixFixed || !fixed.Success || fixed.Attempts != 2 || fixed.LastResult.Stdout != "fixed\n" {
		t.Fatalf("autofix_submit: %+v", fixed)
	}
	if !strings.Contains(text(out), "+print('fixed')") {
		t.Errorf("text part lacks the diff:\n%s", text(out))
	}
	// Bad input: taxonomy errors naming the field.
	for args, want := range map[*map[string]any]string{
		{"language": "python", "code": "x", "max_retries": 0}:        "max_retries",
		{"language": "python", "code": "x", "max_retries": 21}:       "max_retries",
		{"language": "python", "code": "x", "provider": "gpt"}:       "provider",
		{"language": "python", "code": "x", "provider": "anthropic"}: "provider: anthropic is not configured",
	} {
		t.Setenv("ANTHROPIC_API_KEY", "")
		code, msg := errCode(t, c.call("autofix", *args, nil))
		if code != "invalid_argument" || !strings.Contains(msg, want) {
			t.Errorf("autofix %v: %s %q, want invalid_argument %q", *args, code, msg, want)
		}
	}
	if code, _ := errCode(t, c.call("autofix_submit", map[string]any{"autofix_id": fixed.AutofixID, "code": "x"}, nil)); code != "conflict" {
		t.Errorf("submit to a finished loop: %s", code)
	}
}

// fixingModel is the in-process client's model: it answers sampling
// requests with a fixed program, remembering the prompts.
type fixingModel struct {
	mu      sync.Mutex
	prompts []string
}

func (m *fixingModel) CreateMessage(_ context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, msg := range req.Messages {
		if tc, ok := msg.Content.(mcp.TextContent); ok {
			m.prompts = append(m.prompts, tc.Text)
		}
	}
	return &mcp.CreateMessageResult{Model: "fixing-model", StopReason: "endTurn",
		SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("```python main.py\nprint('sampled')\n```\n")}}, nil
}

// Provider sampling with a client that implements sampling: the whole loop
// runs inside one autofix call; each attempt is a progress notification.
func TestAutofixSampling(t *testing.T) {
	testenv.RequireRoot(t)
	e := newEngine(t)
	model := &fixingModel{}
	cl, err := client.NewInProcessClientWithSamplingHandler(NewServer(e, Options{Log: testenv.Logger(t)}), model)
	if err != nil {
		t.Fatal(err)
	}
	c := &mcpClient{Client: cl, t: t}
	cl.OnNotification(func(n mcp.JSONRPCNotification) {
		c.mu.Lock()
		c.notifs = append(c.notifs, n)
		c.mu.Unlock()
	})
	ctx := context.Background()
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "sampling-test", Version: "0"}
	init.Params.Capabilities.Sampling = &mcp.SamplingCapability{}
	if _, err := cl.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })

	out := c.call("autofix", map[string]any{"language": "python", "code": "print(undefined_name)\n", "provider": "sampling"},
		&mcp.Meta{ProgressToken: "af-progress"})
	if out.IsError {
		t.Fatalf("autofix: %s", text(out))
	}
	var res autofixOut
	decodeStructured(t, out, &res)
	if res.Status != apitypes.AutofixFixed || res.Provider != "sampling" || res.Attempts != 2 || res.LastResult.Stdout != "sampled\n" {
		t.Fatalf("autofix: %+v", res)
	}
	if len(model.prompts) != 1 || !strings.Contains(model.prompts[0], "NameError") {
		t.Fatalf("prompts: %q", model.prompts)
	}
	c.mu.Lock()
	var msgs []string
	for _, n := range c.notifs {
		if n.Method == string(mcp.MethodNotificationProgress) {
			if m, ok := n.Params.AdditionalFields["message"].(string); ok && strings.HasPrefix(m, "attempt") {
				msgs = append(msgs, m)
			}
		}
	}
	c.mu.Unlock()
	if len(msgs) != 3 || !strings.Contains(msgs[0], "NameError") || !strings.Contains(msgs[1], "fix by sampling") || !strings.Contains(msgs[2], "success") {
		t.Fatalf("progress messages: %q", msgs)
	}
}

// Provider sampling from a client that cannot sample falls back to client.
func TestAutofixSamplingFallsBack(t *testing.T) {
	testenv.RequireRoot(t)
	e := newEngine(t)
	c := newClient(t, e, Options{})
	res := ok[autofixOut](c, "autofix", map[string]any{"language": "python", "code": "print(undefined_name)\n", "provider": "sampling"})
	if res.Status != apitypes.AutofixNeedsFix || res.Provider != "client" {
		t.Fatalf("autofix: %+v", res)
	}
	ok[autofixOut](c, "autofix_submit", map[string]any{"autofix_id": res.AutofixID, "code": "print(1)\n"})
}
