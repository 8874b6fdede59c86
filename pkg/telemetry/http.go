package telemetry

import (
	"bufio"
	"context"
	"net"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// HTTP wraps an HTTP front end: every request gets a server span named by
// its route template (route returns it, e.g. "POST /v1/sandboxes/{id}/exec",
// never a raw path, so that span names stay few), parented by the
// request's traceparent header when it has one. The span ends when the
// handler returns, with the status code. While tracing is off the request
// goes straight to next.
func HTTP(frontEnd string, route func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if state.Load() == nil {
			next.ServeHTTP(w, r)
			return
		}
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name := route(r)
		ctx, span := startServer(ctx, name, KeyFrontEnd.String(frontEnd), KeyMethod.String(r.Method), KeyRoute.String(name))
		sw := &StatusWriter{ResponseWriter: w}
		defer func() {
			st := sw.Status()
			span.SetAttributes(KeyStatus.Int(st))
			if st >= http.StatusInternalServerError {
				span.SetStatus(codes.Error, http.StatusText(st))
			}
			span.End()
		}()
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// Caller names the request's principal (set by the authentication inside
// HTTP's span) on the span: it wraps the handler behind authentication.
func Caller(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := principal.From(r.Context()); ok {
			SetCaller(r.Context(), p)
		}
		next.ServeHTTP(w, r)
	})
}

// StatusWriter keeps the status code of the answer (the span's here, the
// REST request log's in pkg/api). Flush and Hijack pass
// through (streams and the terminal's WebSocket), as does Unwrap for
// http.ResponseController.
type StatusWriter struct {
	http.ResponseWriter
	status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *StatusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *StatusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Status is the status the handler sent: 200 when it wrote a body without
// a header, or sent nothing at all.
func (w *StatusWriter) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// StartTool starts the span of an MCP tool call, over HTTP (a child of the
// request's span) or stdio. meta is the request's params._meta: its
// traceparent and tracestate (the MCP community's proposal for trace
// context in MCP, docs/mcp.md) parent the span when they name another
// trace than ctx's — the client's per-request context is more precise
// than a header it may send for a whole session — and the HTTP request's
// span is then linked, not lost.
func StartTool(ctx context.Context, tool string, meta map[string]any) (context.Context, trace.Span) {
	tr := state.Load()
	if tr == nil {
		return ctx, noopSpan
	}
	var opts []trace.SpanStartOption
	if tp, _ := meta["traceparent"].(string); tp != "" {
		ts, _ := meta["tracestate"].(string)
		remote := trace.SpanContextFromContext(ExtractTraceparent(context.Background(), tp, ts))
		cur := trace.SpanContextFromContext(ctx)
		if remote.IsValid() && remote.TraceID() != cur.TraceID() {
			if cur.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: cur}))
			}
			ctx = trace.ContextWithRemoteSpanContext(ctx, remote)
		}
	}
	name := boundedName(tool)
	attrs := callerAttrs(ctx, []attribute.KeyValue{KeyTool.String(name)})
	if _, ok := principal.From(ctx); !ok {
		attrs = append(attrs, KeyFrontEnd.String("stdio"))
	} else {
		attrs = append(attrs, KeyFrontEnd.String("mcp"))
	}
	opts = append(opts, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return (*tr).Start(ctx, "mcp tools/call "+name, opts...)
}
