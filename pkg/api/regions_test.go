package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	rtrace "runtime/trace"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
)

// TestTraceRegions: a REST request is a region of Go's execution tracer
// (api.request), its handler below authentication another (api.handler),
// the key check and the audit record theirs (api.authenticate,
// audit.append) — the names docs/ARCHITECTURE.md's breakdown of the front
// end's time reads a trace by. A request with no trace running records
// nothing, so the regions are written only once a trace starts.
func TestTraceRegions(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	log, err := audit.Open(audit.Options{Dir: filepath.Join(t.TempDir(), "audit")})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	hs := httptest.NewServer(NewHandler(&fakeEngine{}, Options{Token: token, Audit: log}))
	defer hs.Close()
	exec := func() {
		t.Helper()
		req, err := http.NewRequest("POST", hs.URL+"/v1/sandboxes/sb-1/exec", strings.NewReader(`{"argv":["true"]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("exec: %s", res.Status)
		}
	}
	names := []string{"api.request", "api.handler", "api.authenticate", "audit.append"}

	var buf bytes.Buffer
	if err := rtrace.Start(&buf); err != nil {
		t.Fatalf("start a trace (is one running already?): %v", err)
	}
	exec()
	// A handler's region ends when its ServeHTTP returns, which may be
	// just after the client has read the answer: Close waits for it.
	hs.Close()
	rtrace.Stop()
	// A region's name is in the trace's string table as its bytes.
	for _, n := range names {
		if !bytes.Contains(buf.Bytes(), []byte(n)) {
			t.Errorf("the trace of a REST exec has no region %q", n)
		}
	}
}
