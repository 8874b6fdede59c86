// Package otlptest runs a real OTLP receiver in process for the tracing
// tests: the OpenTelemetry collector's own otlpreceiver (OTLP/HTTP and
// OTLP/gRPC, the code a production collector runs), whose consumer keeps
// every span it is sent. Tests point the daemon's exporter at Endpoint,
// flush it (telemetry.Provider.Shutdown returns once the collector has
// answered the export), and assert the tree of spans that arrived.
package otlptest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// Span is one received span, flattened for assertions.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      string
	Service                   string
	Attrs                     map[string]string
	Status                    string // "Unset", "Ok", "Error"
	Links                     []string
}

func (s Span) String() string {
	return fmt.Sprintf("%s [%s parent %s] %v", s.Name, s.SpanID, s.ParentID, s.Attrs)
}

// Receiver is a started otlpreceiver and the spans it received.
type Receiver struct {
	// Endpoint is the OTLP/HTTP base URL (http://127.0.0.1:port).
	Endpoint string
	// GRPCEndpoint is the OTLP/gRPC URL (http://127.0.0.1:port).
	GRPCEndpoint string

	mu    sync.Mutex
	spans []Span
}

type host struct{}

func (host) GetExtensions() map[component.ID]component.Component { return nil }

// Start starts a receiver on free loopback ports; it is shut down when the
// test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	f := otlpreceiver.NewFactory()
	cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
	httpAddr, grpcAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = httpAddr
	cfg.Protocols.GRPC.GetOrInsertDefault().NetAddr.Endpoint = grpcAddr
	next, err := consumer.NewTraces(func(_ context.Context, td ptrace.Traces) error {
		r.add(td)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	set := receiver.Settings{
		ID: component.NewID(f.Type()),
		TelemetrySettings: component.TelemetrySettings{
			Logger: zap.NewNop(), TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider(),
			Resource: pcommon.NewResource(),
		},
		BuildInfo: component.NewDefaultBuildInfo(),
	}
	rcv, err := f.CreateTraces(context.Background(), set, cfg, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(context.Background(), host{}); err != nil {
		t.Fatalf("otlpreceiver: %v", err)
	}
	t.Cleanup(func() {
		if err := rcv.Shutdown(context.Background()); err != nil {
			t.Errorf("otlpreceiver shutdown: %v", err)
		}
	})
	r.Endpoint, r.GRPCEndpoint = "http://"+httpAddr, "http://"+grpcAddr
	return r
}

func (r *Receiver) add(td ptrace.Traces) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		svc := ""
		if v, ok := rs.Resource().Attributes().Get("service.name"); ok {
			svc = v.AsString()
		}
		for j := 0; j < rs.ScopeSpans().Len(); j++ {
			ss := rs.ScopeSpans().At(j).Spans()
			for k := 0; k < ss.Len(); k++ {
				s := ss.At(k)
				sp := Span{
					TraceID: s.TraceID().String(), SpanID: s.SpanID().String(), Name: s.Name(),
					Kind: s.Kind().String(), Service: svc, Attrs: map[string]string{}, Status: s.Status().Code().String(),
				}
				if !s.ParentSpanID().IsEmpty() {
					sp.ParentID = s.ParentSpanID().String()
				}
				s.Attributes().Range(func(k string, v pcommon.Value) bool {
					sp.Attrs[k] = v.AsString()
					return true
				})
				for l := 0; l < s.Links().Len(); l++ {
					sp.Links = append(sp.Links, s.Links().At(l).SpanID().String())
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

// Spans returns every span received so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Reset forgets the spans received so far.
func (r *Receiver) Reset() {
	r.mu.Lock()
	r.spans = nil
	r.mu.Unlock()
}

// Trace is the spans of one trace, indexed for walking its tree.
type Trace struct {
	ID       string
	Spans    []Span
	byID     map[string]Span
	children map[string][]Span
}

// Traces groups spans by trace id.
func Traces(spans []Span) map[string]*Trace {
	out := map[string]*Trace{}
	for _, s := range spans {
		t := out[s.TraceID]
		if t == nil {
			t = &Trace{ID: s.TraceID, byID: map[string]Span{}, children: map[string][]Span{}}
			out[s.TraceID] = t
		}
		t.Spans = append(t.Spans, s)
		t.byID[s.SpanID] = s
		t.children[s.ParentID] = append(t.children[s.ParentID], s)
	}
	return out
}

// Children are the spans whose parent is id.
func (t *Trace) Children(id string) []Span { return t.children[id] }

// Parent is the parent of s within the trace (ok false for a root or a
// span whose parent is outside the trace's received spans).
func (t *Trace) Parent(s Span) (Span, bool) {
	p, ok := t.byID[s.ParentID]
	return p, ok
}

// Named returns the spans called name.
func (t *Trace) Named(name string) []Span {
	var out []Span
	for _, s := range t.Spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Ancestors are the names of s's ancestors, nearest first.
func (t *Trace) Ancestors(s Span) []string {
	var out []string
	for p, ok := t.Parent(s); ok; p, ok = t.Parent(p) {
		out = append(out, p.Name)
	}
	return out
}

// Tree prints the trace as an indented tree, for failure messages.
func (t *Trace) Tree() string {
	var b strings.Builder
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		kids := append([]Span(nil), t.children[parent]...)
		sort.Slice(kids, func(i, j int) bool { return kids[i].Name < kids[j].Name })
		for _, k := range kids {
			fmt.Fprintf(&b, "%s%s %v\n", strings.Repeat("  ", depth), k.Name, k.Attrs)
			walk(k.SpanID, depth+1)
		}
	}
	// Roots: spans whose parent was not received (a remote parent too).
	for _, s := range t.Spans {
		if _, ok := t.byID[s.ParentID]; !ok {
			fmt.Fprintf(&b, "%s (parent %q) %v\n", s.Name, s.ParentID, s.Attrs)
			walk(s.SpanID, 1)
		}
	}
	return b.String()
}
