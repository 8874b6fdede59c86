// Package errdefs is SandboxRunner's error taxonomy. Every error that crosses a
// package boundary towards a front end (MCP, REST, sandboxctl) carries one of
// the codes below; front ends map the code once to their own representation
// (HTTP status, MCP isError payload, process exit code).
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is one entry of the error taxonomy.
type Code string

// The taxonomy. Names are part of the external contract (SPEC.md).
const (
	InvalidArgument Code = "invalid_argument"
	NotFound        Code = "not_found"
	Conflict        Code = "conflict"
	LimitExceeded   Code = "limit_exceeded"
	Unavailable     Code = "unavailable"
	Internal        Code = "internal"
)

// Error is an error with a taxonomy code. Message is safe to show to a client.
type Error struct {
	Code    Code
	Message string
	Err     error // optional cause, not shown to clients
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func newf(c Code, format string, args ...any) error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Invalidf returns an invalid_argument error. The message should name the field.
func Invalidf(format string, args ...any) error { return newf(InvalidArgument, format, args...) }

// NotFoundf returns a not_found error.
func NotFoundf(format string, args ...any) error { return newf(NotFound, format, args...) }

// Conflictf returns a conflict error (the object is in the wrong state).
func Conflictf(format string, args ...any) error { return newf(Conflict, format, args...) }

// LimitExceededf returns a limit_exceeded error.
func LimitExceededf(format string, args ...any) error { return newf(LimitExceeded, format, args...) }

// Unavailablef returns an unavailable error (a dependency is missing or down).
func Unavailablef(format string, args ...any) error { return newf(Unavailable, format, args...) }

// Wrap attaches code and a client-safe message to cause.
func Wrap(c Code, cause error, format string, args ...any) error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...), Err: cause}
}

// CodeOf returns the taxonomy code of err: the code of the outermost *Error in
// its chain, or Internal for any other non-nil error, or "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// Is reports whether err carries code c.
func Is(err error, c Code) bool { return err != nil && CodeOf(err) == c }

// MessageOf returns the client-safe message of err.
func MessageOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// HTTPStatus maps a code to its HTTP status. This is the only such mapping.
func HTTPStatus(c Code) int {
	switch c {
	case InvalidArgument:
		return http.StatusBadRequest
	case NotFound:
		return http.StatusNotFound
	case Conflict:
		return http.StatusConflict
	case LimitExceeded:
		return http.StatusTooManyRequests
	case Unavailable:
		return http.StatusServiceUnavailable
	case "":
		return http.StatusOK
	default:
		return http.StatusInternalServerError
	}
}

// ExitCode maps a code to sandboxctl's exit code (SPEC.md): 2 usage or invalid
// argument, 3 not found, 1 any other failure. Exit code 4 (daemon unreachable)
// and 5 (unhealthy) are decided by sandboxctl itself, not by a code.
func ExitCode(c Code) int {
	switch c {
	case "":
		return 0
	case InvalidArgument:
		return 2
	case NotFound:
		return 3
	default:
		return 1
	}
}

// FromHTTPStatus is the inverse of HTTPStatus for clients that only see a status.
func FromHTTPStatus(status int) Code {
	switch status {
	case http.StatusBadRequest:
		return InvalidArgument
	case http.StatusNotFound:
		return NotFound
	case http.StatusConflict:
		return Conflict
	case http.StatusTooManyRequests:
		return LimitExceeded
	case http.StatusServiceUnavailable:
		return Unavailable
	default:
		return Internal
	}
}
