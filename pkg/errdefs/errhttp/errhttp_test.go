package errhttp

import (
	"errors"
	"net/http"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestRoundTrip: every code of the taxonomy has a status of its own, and
// the status reads back as the same code — what the Go client relies on.
func TestRoundTrip(t *testing.T) {
	seen := map[int]errdefs.Code{}
	for _, c := range errdefs.Codes {
		st := Status(c)
		if st < 400 {
			t.Errorf("Status(%s) = %d, want an error status", c, st)
		}
		if other, dup := seen[st]; dup {
			t.Errorf("codes %s and %s share status %d", c, other, st)
		}
		seen[st] = c
		if back := CodeOf(st); back != c {
			t.Errorf("CodeOf(Status(%s)=%d) = %s", c, st, back)
		}
	}
}

// TestSpecTable pins the statuses docs/SPEC.md "Errors" promises.
func TestSpecTable(t *testing.T) {
	want := map[errdefs.Code]int{
		errdefs.InvalidArgument: 400, errdefs.NotFound: 404, errdefs.Conflict: 409,
		errdefs.LimitExceeded: 429, errdefs.Unavailable: 503, errdefs.Unauthenticated: 401,
		errdefs.PermissionDenied: 403, errdefs.Internal: 500,
	}
	for c, st := range want {
		if got := Status(c); got != st {
			t.Errorf("Status(%s) = %d, want %d", c, got, st)
		}
	}
	if got := ToHTTP(nil); got != http.StatusOK {
		t.Errorf("ToHTTP(nil) = %d, want 200", got)
	}
	if got := ToHTTP(errors.New("plain")); got != http.StatusInternalServerError {
		t.Errorf("ToHTTP(plain error) = %d, want 500", got)
	}
	if got := Status("no_such_code"); got != http.StatusInternalServerError {
		t.Errorf("Status(unknown) = %d, want 500", got)
	}
	if got := CodeOf(http.StatusTeapot); got != errdefs.Internal {
		t.Errorf("CodeOf(418) = %s, want internal", got)
	}
}
