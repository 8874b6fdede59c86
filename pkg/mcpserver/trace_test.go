package mcpserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/otlptest"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// TestToolSpans: with tracing on, a tool call is a span named by its
// tool, parented by params._meta.traceparent, naming the sandbox and the
// outcome — a call refused for its arguments carries the code — and never
// the arguments (the command). Against a real OTLP receiver.
func TestToolSpans(t *testing.T) {
	rcv := otlptest.Start(t)
	p, err := telemetry.Setup(context.Background(), telemetry.Options{Endpoint: rcv.Endpoint, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	c := newClient(t, newFake(), Options{})
	const traceID, parent = "6bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	meta := &mcp.Meta{AdditionalFields: map[string]any{"traceparent": "00-" + traceID + "-" + parent + "-01"}}
	c.call("exec_command", map[string]any{"sandbox_id": "sb-0123456789ab", "command": "echo secret-command-text"}, meta)
	if res := c.call("exec_command", map[string]any{"sandbox_id": 5}, meta); !res.IsError {
		t.Fatal("a numeric sandbox_id was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	tr := otlptest.Traces(rcv.Spans())[traceID]
	if tr == nil {
		t.Fatalf("no span in the caller's trace: %v", rcv.Spans())
	}
	spans := tr.Named("mcp tools/call exec_command")
	if len(spans) != 2 {
		t.Fatalf("want 2 tool spans:\n%s", tr.Tree())
	}
	var refused int
	for _, s := range spans {
		if s.ParentID != parent || s.Kind != "Server" || s.Attrs["mcp.tool.name"] != "exec_command" {
			t.Errorf("tool span %+v", s)
		}
		if s.Attrs["sandboxd.error_code"] == "invalid_argument" && s.Attrs["sandboxd.outcome"] == "failure" {
			refused++
		} else if s.Attrs["sandboxd.sandbox_id"] != "sb-0123456789ab" {
			t.Errorf("the call's span does not name its sandbox: %v", s.Attrs)
		}
		for k, v := range s.Attrs {
			if strings.Contains(v, "secret-command-text") {
				t.Fatalf("attribute %s holds the command: %q", k, v)
			}
		}
	}
	if refused != 1 {
		t.Fatalf("%d refused calls' spans carry invalid_argument, want 1:\n%s", refused, tr.Tree())
	}
}
