package agent

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Error codes carried by Error. They match the daemon's error taxonomy.
const (
	CodeInvalidArgument = "invalid_argument"
	CodeNotFound        = "not_found"
	CodeConflict        = "conflict"
	CodeLimitExceeded   = "limit_exceeded"
	CodeUnavailable     = "unavailable"
	CodeInternal        = "internal"
)

var knownCodes = map[string]bool{
	CodeInvalidArgument: true, CodeNotFound: true, CodeConflict: true,
	CodeLimitExceeded: true, CodeUnavailable: true, CodeInternal: true,
}

// Error is an error reported by the agent (or detected by the client while
// validating a request) with a taxonomy code.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error implements error.
func (e *Error) Error() string { return "agent: " + e.Code + ": " + e.Message }

// Errorf returns an *Error with the given code and formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the *Error in err's chain, or "" if there is
// none.
func ErrorCode(err error) string {
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
		return Errorf(CodeInvalidArgument, "invalid job id %q", id)
	}
	return nil
}

// ValidatePath checks that p is an absolute, clean, NUL-free path of
// reasonable length, as required for every path in a file request.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return Errorf(CodeInvalidArgument, "empty path")
	case strings.IndexByte(p, 0) >= 0:
		return Errorf(CodeInvalidArgument, "path contains NUL")
	case len(p) > 4096:
		return Errorf(CodeInvalidArgument, "path longer than 4096 bytes")
	case !path.IsAbs(p):
		return Errorf(CodeInvalidArgument, "path %q is not absolute", p)
	case path.Clean(p) != p:
		return Errorf(CodeInvalidArgument, "path %q is not clean", p)
	}
	return nil
}
