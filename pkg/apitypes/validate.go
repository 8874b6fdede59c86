package apitypes

import (
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The input checks the engine and the services under pkg/services share,
// so that one kind of input is checked one way whichever of them takes it.
// Each error names the request field it is about.

// MaxStdin caps a command's or a program's standard input.
const MaxStdin = 16 << 20

// MaxArgs caps a program's argument count.
const MaxArgs = 1024

// CheckArgs validates a program's arguments.
func CheckArgs(field string, args []string) error {
	if len(args) > MaxArgs {
		return errdefs.Invalidf("%s: %d arguments exceed the maximum %d", field, len(args), MaxArgs)
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return errdefs.Invalidf("%s[%d]: contains a NUL byte", field, i)
		}
	}
	return nil
}

// CheckEnv validates a request's environment variables.
func CheckEnv(field string, env map[string]string) error {
	if len(env) > 256 {
		return errdefs.Invalidf("%s: at most 256 variables", field)
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || len(k) > 256 {
			return errdefs.Invalidf("%s: invalid variable name %q", field, k)
		}
		if strings.ContainsRune(v, 0) || len(v) > 32<<10 {
			return errdefs.Invalidf("%s.%s: value contains NUL or exceeds 32 KiB", field, k)
		}
	}
	return nil
}
