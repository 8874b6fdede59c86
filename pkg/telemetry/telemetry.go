// Package telemetry provides the daemon's distributed traces: an
// OpenTelemetry tracer provider that exports spans over OTLP to the
// collector the administrator names (telemetry.otlp_endpoint), the W3C
// trace-context propagation that lets a caller's traceparent (an HTTP
// header, or an MCP request's params._meta) parent the daemon's spans, and
// the few helpers every layer uses to start and end a span with the
// attributes of docs/SPEC.md ("Traces").
//
// Tracing is off until Setup is given an endpoint: then Start returns the
// context it was given and a span that records nothing, without allocating,
// so the code paths pay one atomic load (BenchmarkStartOff).
//
// Attributes name who called (tenant, key name — never the key), what
// (route, tool, operation, sandbox id) and how it ended (outcome, error
// code). Nothing here ever records an error message, an environment value,
// a command line or a file's content: those may hold secrets, and a trace
// leaves the administrator's host for a collector that may be shared.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Protocols of the OTLP exporter.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// instrumentation is the tracer's name: the module, as OpenTelemetry asks.
const instrumentation = "github.com/sandboxrunner/mcp-sandboxd"

// Options configure the exporter (the `telemetry` section of the
// configuration, validated there).
type Options struct {
	// Endpoint is the collector's URL: http:// (plain) or https:// (TLS).
	// For http/protobuf a URL without a path gets /v1/traces. Empty: off.
	Endpoint string
	// Protocol is ProtocolHTTP (default) or ProtocolGRPC.
	Protocol string
	// Headers are sent with every export (a hosted collector's token).
	Headers map[string]string
	// SampleRatio is the share of new traces recorded (0 to 1); a caller's
	// traceparent decides for its own trace.
	SampleRatio float64
	// ServiceName is the resource's service.name.
	ServiceName string
}

// Provider is a running exporter; Shutdown flushes it.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// state is the tracer in use; nil while tracing is off.
var state atomic.Pointer[trace.Tracer]

// propagator is W3C trace context only: traceparent and tracestate, the
// headers the MCP proposal and every OpenTelemetry SDK speak.
var propagator = propagation.TraceContext{}

// noopSpan is what Start returns while tracing is off: it records nothing
// and ending it ends nothing.
var noopSpan = trace.SpanFromContext(context.Background())

// Setup starts exporting to opt.Endpoint and makes Start record spans.
// With no endpoint it does nothing and returns a nil Provider (whose
// Shutdown is a no-op): no exporter, no goroutine, no connection.
func Setup(ctx context.Context, opt Options) (*Provider, error) {
	if opt.Endpoint == "" {
		return nil, nil
	}
	exp, err := newExporter(ctx, opt)
	if err != nil {
		return nil, err
	}
	name := opt.ServiceName
	if name == "" {
		name = "mcp-sandboxd"
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
		// The caller's sampled flag wins for its own trace, so that a
		// traced agent sees the daemon's part of every trace it sends.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(opt.SampleRatio))),
	)
	tr := tp.Tracer(instrumentation)
	state.Store(&tr)
	return &Provider{tp: tp}, nil
}

func newExporter(ctx context.Context, opt Options) (sdktrace.SpanExporter, error) {
	u, err := url.Parse(opt.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.Invalidf("telemetry.otlp_endpoint: invalid URL %q (use http:// or https://)", opt.Endpoint)
	}
	switch opt.Protocol {
	case "", ProtocolHTTP:
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		o := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u.String()), otlptracehttp.WithTimeout(10 * time.Second)}
		if len(opt.Headers) > 0 {
			o = append(o, otlptracehttp.WithHeaders(opt.Headers))
		}
		return otlptracehttp.New(ctx, o...)
	case ProtocolGRPC:
		o := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(u.String()), otlptracegrpc.WithTimeout(10 * time.Second)}
		if len(opt.Headers) > 0 {
			o = append(o, otlptracegrpc.WithHeaders(opt.Headers))
		}
		return otlptracegrpc.New(ctx, o...)
	}
	return nil, errdefs.Invalidf("telemetry.otlp_protocol: must be %s or %s, got %q", ProtocolHTTP, ProtocolGRPC, opt.Protocol)
}

// Shutdown stops recording and flushes the spans not yet exported, within
// ctx. Safe on a nil Provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	state.Store(nil)
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("telemetry: flush spans: %w", err)
	}
	return nil
}

// Enabled says whether spans are recorded.
func Enabled() bool { return state.Load() != nil }

// Start starts a span named name as a child of ctx's span (or of a remote
// parent Extract put there). While tracing is off it returns ctx itself and
// a span that records nothing.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr := state.Load()
	if tr == nil {
		return ctx, noopSpan
	}
	return (*tr).Start(ctx, name, trace.WithAttributes(attrs...))
}

// startServer starts a span of kind server (a request from a client).
func startServer(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr := state.Load()
	if tr == nil {
		return ctx, noopSpan
	}
	return (*tr).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// StartClient starts a span of kind client (a call the daemon makes, such
// as a request to a sandbox's agent).
func StartClient(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr := state.Load()
	if tr == nil {
		return ctx, noopSpan
	}
	return (*tr).Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// StartChildClient is StartClient only under a span: the calls the daemon
// makes on its own (health checks, the reaper's) would otherwise each be a
// trace of one span, noise that buries the requests' traces.
func StartChildClient(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr := state.Load()
	if tr == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noopSpan
	}
	return (*tr).Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// Attribute keys (docs/SPEC.md, "Traces"). sandboxd.* are ours; the rest
// are OpenTelemetry's semantic conventions.
const (
	KeyTenant    = attribute.Key("sandboxd.tenant")
	KeyKeyName   = attribute.Key("sandboxd.key_name")
	KeyAdmin     = attribute.Key("sandboxd.admin")
	KeyFrontEnd  = attribute.Key("sandboxd.front_end")
	KeySandbox   = attribute.Key("sandboxd.sandbox_id")
	KeyOutcome   = attribute.Key("sandboxd.outcome")
	KeyErrorCode = attribute.Key("sandboxd.error_code")
	KeyStep      = attribute.Key("sandboxd.step")
	KeyLanguage  = attribute.Key("sandboxd.language")
	KeyAttempt   = attribute.Key("sandboxd.attempt")
	KeyImage     = attribute.Key("sandboxd.image")
	KeyAgentOp   = attribute.Key("sandboxd.agent.op")
	KeyExitCode  = attribute.Key("sandboxd.exit_code")
	KeyTool      = attribute.Key("mcp.tool.name")
	KeyMethod    = attribute.Key("http.request.method")
	KeyRoute     = attribute.Key("http.route")
	KeyStatus    = attribute.Key("http.response.status_code")
)

// Sandbox is the sandbox id attribute.
func Sandbox(id string) attribute.KeyValue { return KeySandbox.String(id) }

// End ends span with its outcome: success, or failure and the error's
// taxonomy code (never its message, which may quote a caller's input).
// It returns err, so that `return telemetry.End(span, err)` ends a call.
func End(span trace.Span, err error) error {
	if !span.IsRecording() {
		span.End()
		return err
	}
	SetOutcome(span, err)
	span.End()
	return err
}

// SetOutcome sets the outcome and error code of a span without ending it.
func SetOutcome(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err == nil {
		span.SetAttributes(KeyOutcome.String("success"))
		return
	}
	code := errdefs.CodeOf(err)
	if errors.Is(err, context.Canceled) {
		code = "canceled"
	}
	span.SetAttributes(KeyOutcome.String("failure"), KeyErrorCode.String(string(code)))
	span.SetStatus(codes.Error, string(code))
}

// RecordError sets the outcome of ctx's span (a front end's request span,
// where its one error path is).
func RecordError(ctx context.Context, err error) {
	SetOutcome(trace.SpanFromContext(ctx), err)
}

// SetCaller names the caller on ctx's span: the tenant and key name of p,
// never its key. A front end calls it where authentication found p.
func SetCaller(ctx context.Context, p principal.Principal) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(KeyTenant.String(p.Tenant), KeyKeyName.String(p.KeyName), KeyAdmin.Bool(p.Admin))
}

// callerAttrs are the caller's attributes from ctx's principal, if any.
func callerAttrs(ctx context.Context, attrs []attribute.KeyValue) []attribute.KeyValue {
	if p, ok := principal.From(ctx); ok {
		attrs = append(attrs, KeyTenant.String(p.Tenant), KeyKeyName.String(p.KeyName), KeyAdmin.Bool(p.Admin))
	}
	return attrs
}

// StartOp starts a service operation's span (create, exec, run_code, an
// image build, an autofix loop) with the caller's tenant and key name from
// ctx's principal and the given attributes.
func StartOp(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if state.Load() == nil {
		return ctx, noopSpan
	}
	return Start(ctx, name, callerAttrs(ctx, attrs)...)
}

// ExtractTraceparent returns ctx with the remote parent a W3C traceparent
// (and tracestate) names; a malformed or empty one leaves ctx as it is,
// as the W3C recommendation asks (a new trace is started instead).
func ExtractTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" || state.Load() == nil {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return propagator.Extract(ctx, c)
}

// Inject writes ctx's span as traceparent/tracestate into set (an outgoing
// request's headers). Nothing is written while tracing is off.
func Inject(ctx context.Context, set func(key, value string)) {
	if state.Load() == nil {
		return
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	for k, v := range c {
		set(k, v)
	}
}

// boundedName cuts a name that comes from a caller (an MCP tool name) so
// that a hostile one cannot make span names unbounded.
func boundedName(s string) string {
	const max = 64
	if len(s) > max {
		s = s[:max]
	}
	return strings.ToValidUTF8(s, "?")
}

// AgentSpan is the daemon's tracer of requests to a sandbox's agent
// (pkg/agent.SetTracer): a client span "agent <op>" under the request's
// span, ended with the request's outcome.
func AgentSpan(ctx context.Context, op string) (context.Context, func(error)) {
	ctx, span := StartChildClient(ctx, "agent "+op, KeyAgentOp.String(op))
	if !span.IsRecording() {
		return ctx, func(error) {}
	}
	return ctx, func(err error) { End(span, err) }
}
