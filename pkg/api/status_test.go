package api

import (
	"net/http"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
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
		if got := errhttp.Status(c.code); got != c.status {
			t.Errorf("errhttp.Status(%q) = %d, want %d", c.code, got, c.status)
		}
	}
}
