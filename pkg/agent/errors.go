package agent

import (
	"errors"
	"path"
	"regexp"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Error is an error reported by the agent (or detected by the client while
// validating a request): the taxonomy's error, whose JSON is the wire form.
type Error = errdefs.Error

// Errorf returns an *Error with the given code and formatted message.
func Errorf(code errdefs.Code, format string, args ...any) *Error {
	return errdefs.New(code, format, args...)
}

// ErrorCode returns the code of the *Error in err's chain, or "" if there is
// none.
func ErrorCode(err error) errdefs.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

var (
	// ErrUnavailable wraps failures to reach the agent's socket.
	ErrUnavailable = errors.New("agent unavailable")
	// ErrProtocol wraps every violation of the protocol by the peer:
	// oversized lines or payloads, malformed JSON, invalid fields.
	ErrProtocol = errors.New("agent protocol violation")
)

var jobIDPattern = regexp.MustCompile(`^j-[0-9a-f]{16}$`)

// ValidateJobID reports whether id has the form the agent generates.
func ValidateJobID(id string) error {
	if !jobIDPattern.MatchString(id) {
		return Errorf(errdefs.InvalidArgument, "invalid job id %q", id)
	}
	return nil
}

// ValidatePath checks that p is an absolute, clean, NUL-free path of
// reasonable length, as required for every path in a file request.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return Errorf(errdefs.InvalidArgument, "empty path")
	case strings.IndexByte(p, 0) >= 0:
		return Errorf(errdefs.InvalidArgument, "path contains NUL")
	case len(p) > 4096:
		return Errorf(errdefs.InvalidArgument, "path longer than 4096 bytes")
	case !path.IsAbs(p):
		return Errorf(errdefs.InvalidArgument, "path %q is not absolute", p)
	case path.Clean(p) != p:
		return Errorf(errdefs.InvalidArgument, "path %q is not clean", p)
	}
	return nil
}
