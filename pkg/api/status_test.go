package api

import (
	"net/http"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestHTTPStatus(t *testing.T) {
	for _, c := range []struct {
		code   errdefs.Code
		status int
	}{
		{errdefs.InvalidArgument, http.StatusBadRequest},
		{errdefs.NotFound, http.StatusNotFound},
		{errdefs.Conflict, http.StatusConflict},
		{errdefs.LimitExceeded, http.StatusTooManyRequests},
		{errdefs.Unavailable, http.StatusServiceUnavailable},
		{errdefs.Unauthenticated, http.StatusUnauthorized},
		{errdefs.Internal, http.StatusInternalServerError},
		{"", http.StatusOK},
	} {
		if got := httpStatus(c.code); got != c.status {
			t.Errorf("httpStatus(%q) = %d, want %d", c.code, got, c.status)
		}
	}
}
