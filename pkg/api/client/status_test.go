package client

import (
	"net/http"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// codeOfStatus must invert the daemon's mapping (pkg/api httpStatus).
func TestCodeOfStatus(t *testing.T) {
	for status, want := range map[int]errdefs.Code{
		http.StatusBadRequest:          errdefs.InvalidArgument,
		http.StatusNotFound:            errdefs.NotFound,
		http.StatusConflict:            errdefs.Conflict,
		http.StatusTooManyRequests:     errdefs.LimitExceeded,
		http.StatusServiceUnavailable:  errdefs.Unavailable,
		http.StatusUnauthorized:        errdefs.Unauthenticated,
		http.StatusForbidden:           errdefs.PermissionDenied,
		http.StatusInternalServerError: errdefs.Internal,
		http.StatusBadGateway:          errdefs.Internal,
	} {
		if got := codeOfStatus(status); got != want {
			t.Errorf("codeOfStatus(%d) = %s, want %s", status, got, want)
		}
	}
}
