// Package errhttp maps SandboxRunner's error taxonomy (pkg/errdefs) to HTTP
// statuses and back, after containerd's errdefs/errhttp: one table, read
// in both directions, so that the daemon's REST answers (pkg/api), the
// preview listener and the Go client (pkg/api/client) cannot disagree. It
// imports nothing but the taxonomy and net/http, so the static sandboxctl
// links it.
package errhttp

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// statuses is the one code → status table (docs/SPEC.md "Errors").
var statuses = map[errdefs.Code]int{
	errdefs.InvalidArgument:  http.StatusBadRequest,
	errdefs.NotFound:         http.StatusNotFound,
	errdefs.Conflict:         http.StatusConflict,
	errdefs.LimitExceeded:    http.StatusTooManyRequests,
	errdefs.Unavailable:      http.StatusServiceUnavailable,
	errdefs.Unauthenticated:  http.StatusUnauthorized,
	errdefs.PermissionDenied: http.StatusForbidden,
	// After containerd's errhttp: the state forbids it until changed.
	errdefs.FailedPrecondition: http.StatusPreconditionFailed,
	errdefs.Internal:           http.StatusInternalServerError,
}

// Status is the HTTP status of code c: 200 for no code (""), 500 for a
// code the table does not know.
func Status(c errdefs.Code) int {
	if c == "" {
		return http.StatusOK
	}
	if st, ok := statuses[c]; ok {
		return st
	}
	return http.StatusInternalServerError
}

// ToHTTP is the HTTP status of err (200 for nil).
func ToHTTP(err error) int { return Status(errdefs.CodeOf(err)) }

// CodeOf inverts Status for an answer that carries only a status (a proxy's
// page, a body that is not the error object): internal for any status the
// table does not name.
func CodeOf(status int) errdefs.Code {
	for c, st := range statuses {
		if st == status {
			return c
		}
	}
	return errdefs.Internal
}
