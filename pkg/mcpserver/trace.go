package mcpserver

import (
	"context"
	"reflect"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// startToolSpan starts a tool call's span (pkg/telemetry): a child of the
// HTTP request's span, or of the traceparent in the call's params._meta
// (docs/mcp.md, "Traces").
func startToolSpan(ctx context.Context, name string, req mcp.CallToolRequest) (context.Context, trace.Span) {
	var meta map[string]any
	if req.Params.Meta != nil {
		meta = req.Params.Meta.AdditionalFields
	}
	return telemetry.StartTool(ctx, name, meta)
}

// endToolSpan ends it with the sandbox the call acted on (its sandbox_id
// argument or result field) and its outcome. Nothing else of the
// arguments goes in: they hold code, commands and file contents.
func endToolSpan(span trace.Span, in, out any, err error) {
	if span.IsRecording() {
		for _, v := range []any{in, out} {
			if rv := reflect.Indirect(reflect.ValueOf(v)); rv.Kind() == reflect.Struct {
				if id := fieldByTag(rv, "sandbox_id"); id != "" {
					span.SetAttributes(telemetry.Sandbox(id))
					break
				}
			}
		}
	}
	telemetry.End(span, err)
}
