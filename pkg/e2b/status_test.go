package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
)

// TestErrorStatusesAreTheDaemons checks that the E2B API answers every
// taxonomy code with the status REST gives it (pkg/errdefs/errhttp): its
// own copy of the table once answered failed_precondition with 500.
func TestErrorStatusesAreTheDaemons(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{errdefs.Invalidf("field %q: bad", "timeout"), http.StatusBadRequest},
		{errdefs.NotFoundf("sandbox %q", "x"), http.StatusNotFound},
		{errdefs.FailedPreconditionf("sandbox is paused"), http.StatusPreconditionFailed},
		{errdefs.PermissionDeniedf("no"), http.StatusForbidden},
		{errdefs.LimitExceededf("quota"), http.StatusTooManyRequests},
		{errdefs.Unavailablef("later"), http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		writeErr(rec, c.err)
		if rec.Code != c.want || rec.Code != errhttp.ToHTTP(c.err) {
			t.Errorf("%v: status %d, want %d", c.err, rec.Code, c.want)
		}
		var body errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", c.err, rec.Body, err)
		}
		if body.Code != c.want || body.Message != errdefs.MessageOf(c.err) {
			t.Errorf("%v: body %+v", c.err, body)
		}
	}
}
