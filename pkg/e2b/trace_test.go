package e2b

import (
	"net/http/httptest"
	"testing"
)

// TestTraceRoute: span names are route templates and envd procedures; a
// sandbox id, an unknown path or an unknown procedure never becomes part
// of a name (a client could otherwise mint unbounded span names).
func TestTraceRoute(t *testing.T) {
	s := New(nil, Options{Keys: []string{"e2b_00112233445566778899"}, Domain: "sbx.example.com"})
	defer s.Close()
	for _, tc := range []struct{ method, target, sandboxHeader, want string }{
		{"POST", "/sandboxes", "", "POST /sandboxes"},
		{"POST", "/v2/sandboxes", "", "POST /v2/sandboxes"},
		{"DELETE", "/sandboxes/sbabc123", "", "DELETE /sandboxes/{id}"},
		{"POST", "/sandboxes/sbabc123/timeout", "", "POST /sandboxes/{id}/timeout"},
		{"POST", "/v2/sandboxes/sbabc123/connect", "", "POST /v2/sandboxes/{id}/connect"},
		{"GET", "/sandboxes/sbabc123/../../etc/passwd", "", "GET (unmatched)"},
		{"GET", "/random-path-12345", "", "GET (unmatched)"},
		{"POST", "/process.Process/Start", "sbabc123", "envd /process.Process/Start"},
		{"POST", "/filesystem.Filesystem/ListDir", "sbabc123", "envd /filesystem.Filesystem/ListDir"},
		{"POST", "/process.Process/Evil12345", "sbabc123", "envd POST (unmatched)"},
		{"GET", "/files", "sbabc123", "envd /files"},
		{"GET", "http://3000-sbabc123.sbx.example.com/anything/12345", "", "GET relay"},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if tc.sandboxHeader != "" {
			r.Header.Set("E2b-Sandbox-Id", tc.sandboxHeader)
		}
		if got := s.TraceRoute(r); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.target, got, tc.want)
		}
	}
}
