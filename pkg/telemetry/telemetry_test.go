package telemetry_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sandboxrunner/mcp-sandboxd/internal/otlptest"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + callerTrace + "-" + callerSpan + "-01"
)

// setup exports to rcv until the returned flush is called (and at the
// test's end).
func setup(t *testing.T, endpoint, protocol string) (flush func()) {
	t.Helper()
	p, err := telemetry.Setup(context.Background(), telemetry.Options{Endpoint: endpoint, Protocol: protocol, SampleRatio: 1, ServiceName: "sandboxd-test"})
	if err != nil {
		t.Fatal(err)
	}
	done := false
	flush = func() {
		if done {
			return
		}
		done = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatalf("flush: %v", err)
		}
	}
	t.Cleanup(flush)
	return flush
}

// TestSpansReachReceiver: spans started through the package arrive at a
// real OTLP receiver over both protocols, parented as started, with the
// caller's traceparent as the root's parent, and the caller and outcome
// attributes — and no error message.
func TestSpansReachReceiver(t *testing.T) {
	rcv := otlptest.Start(t)
	for _, proto := range []string{telemetry.ProtocolHTTP, telemetry.ProtocolGRPC} {
		t.Run(proto, func(t *testing.T) {
			rcv.Reset()
			ep := rcv.Endpoint
			if proto == telemetry.ProtocolGRPC {
				ep = rcv.GRPCEndpoint
			}
			flush := setup(t, ep, proto)
			if !telemetry.Enabled() {
				t.Fatal("Enabled() is false after Setup with an endpoint")
			}
			ctx := telemetry.ExtractTraceparent(context.Background(), traceparent, "vendor=1")
			ctx = principal.With(ctx, principal.Principal{KeyID: "k1", KeyName: "alice", Tenant: "team-a"})
			ctx, op := telemetry.StartOp(ctx, "sandbox.exec", telemetry.Sandbox("sb-1"))
			_, agent := telemetry.StartClient(ctx, "agent start")
			telemetry.End(agent, errdefs.NotFoundf("secret-path /home/x/token not found"))
			telemetry.End(op, nil)
			flush()
			if telemetry.Enabled() {
				t.Fatal("Enabled() is true after Shutdown")
			}
			tr := otlptest.Traces(rcv.Spans())[callerTrace]
			if tr == nil || len(tr.Spans) != 2 {
				t.Fatalf("want 2 spans in trace %s, got %v", callerTrace, rcv.Spans())
			}
			ex, ag := tr.Named("sandbox.exec"), tr.Named("agent start")
			if len(ex) != 1 || len(ag) != 1 {
				t.Fatalf("spans:\n%s", tr.Tree())
			}
			if ex[0].ParentID != callerSpan || ag[0].ParentID != ex[0].SpanID {
				t.Fatalf("parents wrong:\n%s", tr.Tree())
			}
			if ex[0].Service != "sandboxd-test" || ex[0].Attrs["sandboxd.tenant"] != "team-a" || ex[0].Attrs["sandboxd.key_name"] != "alice" ||
				ex[0].Attrs["sandboxd.sandbox_id"] != "sb-1" || ex[0].Attrs["sandboxd.outcome"] != "success" {
				t.Fatalf("exec span: %+v", ex[0])
			}
			if ag[0].Kind != "Client" || ag[0].Attrs["sandboxd.outcome"] != "failure" || ag[0].Attrs["sandboxd.error_code"] != "not_found" || ag[0].Status != "Error" {
				t.Fatalf("agent span: %+v", ag[0])
			}
			for _, s := range tr.Spans {
				for k, v := range s.Attrs {
					if strings.Contains(v, "secret-path") {
						t.Fatalf("span %s attribute %s carries the error message: %q", s.Name, k, v)
					}
				}
			}
		})
	}
}

// TestHTTPMiddleware: the server span takes the route template (not the
// raw path), the traceparent header as parent, the status, and the caller
// Caller finds behind authentication.
func TestHTTPMiddleware(t *testing.T) {
	rcv := otlptest.Start(t)
	flush := setup(t, rcv.Endpoint, "")
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		telemetry.RecordError(r.Context(), errdefs.Invalidf("command: empty"))
		w.WriteHeader(http.StatusBadRequest)
	})
	h = telemetry.Caller(h)
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(principal.With(r.Context(), principal.Principal{KeyName: "bob", Tenant: "team-b"})))
		})
	}
	route := func(r *http.Request) string { return r.Method + " /v1/sandboxes/{id}/exec" }
	hs := httptest.NewServer(telemetry.HTTP("rest", route, auth(h)))
	defer hs.Close()
	req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/sb-12345/exec", nil)
	req.Header.Set("traceparent", traceparent)
	res, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	flush()
	tr := otlptest.Traces(rcv.Spans())[callerTrace]
	if tr == nil || len(tr.Spans) != 1 {
		t.Fatalf("want one span in the caller's trace, got %v", rcv.Spans())
	}
	s := tr.Spans[0]
	if s.Name != "POST /v1/sandboxes/{id}/exec" || s.ParentID != callerSpan || s.Kind != "Server" {
		t.Fatalf("span: %+v", s)
	}
	want := map[string]string{"http.response.status_code": "400", "http.route": "POST /v1/sandboxes/{id}/exec", "sandboxd.front_end": "rest",
		"sandboxd.tenant": "team-b", "sandboxd.key_name": "bob", "sandboxd.error_code": "invalid_argument", "sandboxd.outcome": "failure"}
	for k, v := range want {
		if s.Attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q (%v)", k, s.Attrs[k], v, s.Attrs)
		}
	}
}

// TestToolMeta: an MCP tool call's params._meta.traceparent parents the
// tool span when it names another trace than the HTTP request's (the HTTP
// span is linked); one of the same trace keeps the HTTP parent; a
// malformed one is ignored.
func TestToolMeta(t *testing.T) {
	rcv := otlptest.Start(t)
	flush := setup(t, rcv.Endpoint, "")
	ctx, httpSpan := telemetry.Start(context.Background(), "POST /mcp")
	_, a := telemetry.StartTool(ctx, "run_code", map[string]any{"traceparent": traceparent})
	telemetry.End(a, nil)
	_, b := telemetry.StartTool(ctx, "exec_command", map[string]any{"traceparent": "00-zz-bad-01"})
	telemetry.End(b, nil)
	same := "00-" + httpSpan.SpanContext().TraceID().String() + "-" + "1111111111111111" + "-01"
	_, c := telemetry.StartTool(ctx, "read_file", map[string]any{"traceparent": same})
	telemetry.End(c, nil)
	_, d := telemetry.StartTool(context.Background(), strings.Repeat("x", 500), nil)
	telemetry.End(d, nil)
	httpSpan.End()
	flush()
	spans := rcv.Spans()
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	h := byName["POST /mcp"]
	if s := byName["mcp tools/call run_code"]; s.TraceID != callerTrace || s.ParentID != callerSpan || len(s.Links) != 1 || s.Links[0] != h.SpanID {
		t.Errorf("run_code with another trace's traceparent: %+v (http span %s)", s, h.SpanID)
	}
	if s := byName["mcp tools/call exec_command"]; s.TraceID != h.TraceID || s.ParentID != h.SpanID {
		t.Errorf("malformed traceparent changed the parent: %+v", s)
	}
	if s := byName["mcp tools/call read_file"]; s.TraceID != h.TraceID || s.ParentID != h.SpanID {
		t.Errorf("same-trace traceparent: %+v", s)
	}
	if s := byName["mcp tools/call "+strings.Repeat("x", 64)]; s.Attrs["sandboxd.front_end"] != "stdio" {
		t.Errorf("a long tool name is not cut to 64 bytes or the stdio call is not marked: %v", spans)
	}
}

// TestOffConnectsNowhere: with no endpoint, Setup starts nothing — even
// with the SDK's own environment variables pointing at a listening
// collector — and spans are not recorded. The same listener, named as
// the endpoint, is connected to: the check can fail.
func TestOffConnectsNowhere(t *testing.T) {
	var conns atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	ep := "http://" + l.Addr().String()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ep)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")

	p, err := telemetry.Setup(context.Background(), telemetry.Options{})
	if err != nil || p != nil || telemetry.Enabled() {
		t.Fatalf("Setup without endpoint = %v, %v, enabled %v", p, err, telemetry.Enabled())
	}
	ctx, s := telemetry.StartOp(context.Background(), "sandbox.exec")
	if s.IsRecording() || trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("a span records while tracing is off")
	}
	telemetry.End(s, errors.New("x"))
	if got := telemetry.ExtractTraceparent(context.Background(), traceparent, ""); trace.SpanContextFromContext(got).IsValid() {
		t.Fatal("a traceparent is extracted while tracing is off")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections to the collector with tracing off", n)
	}

	// The control: named as the endpoint, the listener is reached.
	flush := setup(t, ep, "")
	_, s = telemetry.Start(context.Background(), "x")
	s.End()
	flush()
	if conns.Load() == 0 {
		t.Fatal("the exporter never connected to the listener it was given: the check above proves nothing")
	}
}

// TestSetupRefuses: a malformed endpoint or protocol is refused naming the
// key, and tracing stays off.
func TestSetupRefuses(t *testing.T) {
	for _, o := range []telemetry.Options{
		{Endpoint: "collector:4318"},
		{Endpoint: "ftp://collector"},
		{Endpoint: "http://collector:4318", Protocol: "thrift"},
	} {
		_, err := telemetry.Setup(context.Background(), o)
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "telemetry.otlp_") {
			t.Errorf("Setup(%+v) = %v, want invalid_argument naming the key", o, err)
		}
		if telemetry.Enabled() {
			t.Fatal("tracing on after a refused Setup")
		}
	}
}

// BenchmarkStartOff is the cost of a span while tracing is off: the whole
// of what tracing costs a request then.
func BenchmarkStartOff(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, s := telemetry.StartOp(ctx, "sandbox.exec", telemetry.Sandbox("sb-1"))
		_ = c
		telemetry.End(s, nil)
	}
}

// BenchmarkRequestOn is the CPU cost of an exec's spans with tracing on
// and every span exported (to a real receiver): a server span, the
// engine's span and two agent spans, as in an exec over REST.
func BenchmarkRequestOn(b *testing.B) {
	rcv := otlptest.Start(b)
	p, err := telemetry.Setup(context.Background(), telemetry.Options{Endpoint: rcv.Endpoint, SampleRatio: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	ctx := principal.With(context.Background(), principal.Principal{KeyName: "k", Tenant: "t"})
	b.ReportAllocs()
	for b.Loop() {
		c := telemetry.ExtractTraceparent(ctx, traceparent, "")
		c, req := telemetry.StartClient(c, "POST /v1/sandboxes/{id}/exec")
		c2, op := telemetry.StartOp(c, "sandbox.exec", telemetry.Sandbox("sb-1"))
		for _, name := range []string{"start", "attach"} {
			_, end := telemetry.AgentSpan(c2, name)
			end(nil)
		}
		telemetry.End(op, nil)
		telemetry.End(req, nil)
	}
}
