package sandbox

import (
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// CheckID refuses a sandbox id that is empty or could not be one (too long,
// or holding a path separator, NUL or space), naming the field, so that
// every service validates ids alike before it looks one up.
func CheckID(id string) error {
	if id == "" {
		return errdefs.Invalidf("sandbox_id: required")
	}
	if len(id) > 64 || strings.ContainsAny(id, "/\x00 ") {
		return errdefs.Invalidf("sandbox_id: malformed %q", id)
	}
	return nil
}
