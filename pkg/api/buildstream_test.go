package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestBuildRefusedBeforeStream: POST /v1/images/{name}/build with a name
// that is refused before any build log (malformed, unknown recipe, unknown
// guest) answers with the error's status and the one error body, not a 200
// with an NDJSON error line; the client sees the error's code.
func TestBuildRefusedBeforeStream(t *testing.T) {
	ts := newTestServer(t)
	for _, tc := range []struct{ path, code, field, msg string }{
		{"/v1/images/Bad..Name/build", "invalid_argument", "name", "malformed"},
		{"/v1/images/" + strings.Repeat("a", 64) + "/build", "invalid_argument", "name", "at most 63"},
		{"/v1/images/nosuchrecipe/build", "invalid_argument", "name", "no recipe"},
		{"/v1/images/nosuchrecipe/build?vm=true", "invalid_argument", "name", "no guest image"},
	} {
		resp := ts.request(t, http.MethodPost, tc.path, nil, true)
		if ct := resp.Header.Get("Content-Type"); strings.Contains(ct, "ndjson") {
			t.Errorf("%s: answered as a stream (%s)", tc.path, ct)
		}
		e := decodeError(t, resp)
		if resp.StatusCode != http.StatusBadRequest || e.Code != tc.code || !strings.HasPrefix(e.Message, tc.field+":") || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: %d %+v, want 400 %s naming %s (%s)", tc.path, resp.StatusCode, e, tc.code, tc.field, tc.msg)
		}
	}
	// Through the client: the error keeps its code.
	_, err := ts.unix.BuildImage(context.Background(), "nosuchrecipe", func(string) { t.Error("a log line for an unknown recipe") })
	if err == nil || errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "no recipe") {
		t.Errorf("client BuildImage of an unknown recipe: %v (code %v), want invalid_argument", err, errdefs.CodeOf(err))
	}
}
