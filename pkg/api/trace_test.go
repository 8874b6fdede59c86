package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/otlptest"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// TestTraceSpans: with tracing on, each REST request is one server span
// named by its route template, parented by the caller's traceparent,
// carrying the status, the caller and, for an error, its code; a path no
// route knows is named by its method only. Against a real OTLP receiver.
func TestTraceSpans(t *testing.T) {
	rcv := otlptest.Start(t)
	p, err := telemetry.Setup(context.Background(), telemetry.Options{Endpoint: rcv.Endpoint, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	const token = "0123456789abcdef0123456789abcdef"
	hs := httptest.NewServer(NewHandler(&fakeEngine{}, Options{Token: token}))
	defer hs.Close()
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4736"
	do := func(method, path, body string) int {
		req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if st := do("POST", "/v1/sandboxes/sb-1/exec", `{"argv":["true"]}`); st != http.StatusOK {
		t.Fatalf("exec: %d", st)
	}
	if st := do("POST", "/v1/sandboxes/sb-1/exec", `{"argv":`); st != http.StatusBadRequest {
		t.Fatalf("bad exec: %d", st)
	}
	if st := do("GET", "/v1/secret-path-xyz/sb-1", ""); st != http.StatusNotFound {
		t.Fatalf("unknown route: %d", st)
	}
	// A handler's span ends when its ServeHTTP returns, which may be just
	// after the client has read the answer: Close waits for every request
	// in flight, so that no span ends after the provider's Shutdown
	// (which would drop it).
	hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	tr := otlptest.Traces(rcv.Spans())[traceID]
	if tr == nil || len(tr.Spans) != 3 {
		t.Fatalf("want 3 spans in the caller's trace, got %v", rcv.Spans())
	}
	var ok, bad int
	for _, s := range tr.Named("POST /v1/sandboxes/{id}/exec") {
		if s.ParentID != "00f067aa0ba902b7" || s.Attrs["sandboxd.front_end"] != "rest" || s.Attrs["sandboxd.key_name"] == "" {
			t.Errorf("exec span %+v", s)
		}
		switch s.Attrs["http.response.status_code"] {
		case "200":
			ok++
			if s.Attrs["sandboxd.error_code"] != "" {
				t.Errorf("a 200 with an error code: %v", s.Attrs)
			}
		case "400":
			bad++
			if s.Attrs["sandboxd.error_code"] != "invalid_argument" || s.Attrs["sandboxd.outcome"] != "failure" {
				t.Errorf("a 400 without its code: %v", s.Attrs)
			}
		}
	}
	if ok != 1 || bad != 1 {
		t.Fatalf("exec spans: %d ok, %d bad:\n%s", ok, bad, tr.Tree())
	}
	nr := tr.Named("GET (unmatched)")
	if len(nr) != 1 || nr[0].Attrs["http.response.status_code"] != "404" {
		t.Fatalf("unknown route:\n%s", tr.Tree())
	}
	for _, s := range tr.Spans {
		for k, v := range s.Attrs {
			if strings.Contains(v, "secret-path") || strings.Contains(v, token) {
				t.Fatalf("span %s attribute %s = %q", s.Name, k, v)
			}
		}
	}
}
