package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// FuzzDecodeJSON: the REST body decoder (size cap, unknown fields, trailing
// data) answers every body with a decoded request or invalid_argument.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"language":"shell"}`, `{"language":"shell"} {}`, `{"nosuch":1}`, `{"memory_mb":-1}`, ``, `{`,
		`{"language":"shell","labels":{"k":"v"},"ttl_seconds":9223372036854775807}`,
	} {
		f.Add([]byte(s))
	}
	s := &server{opt: Options{MaxBodyBytes: 4096}}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", bytes.NewReader(body))
		var req apitypes.CreateSandboxRequest
		if err := s.decodeJSON(httptest.NewRecorder(), r, &req); err != nil && !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("decodeJSON(%q) = %v, want invalid_argument", body, err)
		}
	})
}
