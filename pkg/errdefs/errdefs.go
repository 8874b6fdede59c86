// Package errdefs is SandboxRunner's error taxonomy, after containerd's
// errdefs module. Every error that crosses a package boundary towards a front
// end (MCP, REST, sandboxctl) or over the agent protocol carries one of the
// codes below. The package knows nothing of transports: each front end maps
// a code to its own representation (HTTP status in pkg/api, exit code in
// cmd/sandboxctl, isError payload in pkg/mcpserver) beside its own code.
//
// Messages are for clients: an error that carries no code is an internal
// error whose detail goes to the log only (MessageOf says "internal error").
package errdefs

import (
	"errors"
	"fmt"
	"strings"
)

// Code is one entry of the error taxonomy.
type Code string

// The taxonomy. Names are part of the external contract (docs/SPEC.md).
const (
	InvalidArgument Code = "invalid_argument"
	NotFound        Code = "not_found"
	Conflict        Code = "conflict"
	LimitExceeded   Code = "limit_exceeded"
	Unavailable     Code = "unavailable"
	Unauthenticated Code = "unauthenticated"
	// PermissionDenied: authenticated, but this request may not be made
	// (a browser request failing the web editor's CSRF or Origin checks).
	PermissionDenied Code = "permission_denied"
	// FailedPrecondition: the request is well formed but the state of what
	// it acts on forbids it until something else changes first (a volume
	// still mounted by live sandboxes cannot be deleted). Unlike conflict,
	// retrying alone does not help: the caller must act first.
	FailedPrecondition Code = "failed_precondition"
	Internal           Code = "internal"
)

// Codes lists the taxonomy.
var Codes = []Code{InvalidArgument, NotFound, Conflict, LimitExceeded, Unavailable, Unauthenticated, PermissionDenied, FailedPrecondition, Internal}

// Known reports whether c is a code of the taxonomy.
func Known(c Code) bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// Error is an error with a taxonomy code. Message is safe to show to a client.
// Its JSON form is the wire form of the agent protocol and of REST error
// bodies.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Err     error  `json:"-"` // optional cause, not shown to clients
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func newf(c Code, format string, args ...any) error { return New(c, format, args...) }

// New returns an error with code c and a formatted client-safe message.
func New(c Code, format string, args ...any) *Error {
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

// FailedPreconditionf is New(FailedPrecondition, ...).
func FailedPreconditionf(format string, args ...any) error {
	return newf(FailedPrecondition, format, args...)
}

// Unauthenticatedf returns an unauthenticated error (no or a wrong credential).
func Unauthenticatedf(format string, args ...any) error {
	return newf(Unauthenticated, format, args...)
}

// PermissionDeniedf returns a permission_denied error.
func PermissionDeniedf(format string, args ...any) error {
	return newf(PermissionDenied, format, args...)
}

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

// MessageOf returns the client-safe message of err: the message of its
// outermost *Error with the context that wrapping added in front of it
// ("files: write x: " + message). An error of no known class is "internal
// error": its detail is for the log, not the client.
func MessageOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if !errors.As(err, &e) {
		return "internal error"
	}
	full, inner := err.Error(), e.Error()
	if i := strings.LastIndex(full, inner); i > 0 {
		return full[:i] + e.Message
	}
	return e.Message
}
