package apitypes

import (
	"strings"
	"time"

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

// MaxReadyTimeout bounds a template's readiness wait (ready.timeout_seconds).
const MaxReadyTimeout = 600 * time.Second

// CheckTemplate validates a template's start command, readiness check and
// pool (at most maxPool, sandbox.max_sandboxes); its name and its defaults
// as a create are the engine's to check.
func CheckTemplate(t *TemplateCreateRequest, maxPool int) error {
	if t.StartCommand != "" {
		if len(t.StartCommand) > 8192 || strings.ContainsRune(t.StartCommand, 0) {
			return errdefs.Invalidf("start_command: longer than 8192 bytes or holds NUL")
		}
		if t.Ready == nil {
			return errdefs.Invalidf("ready: required with start_command (a port or a command)")
		}
	}
	if r := t.Ready; r != nil {
		if t.StartCommand == "" && r.Port != 0 {
			return errdefs.Invalidf("ready.port: needs a start_command that listens on it")
		}
		switch {
		case (r.Port != 0) == (r.Command != ""):
			return errdefs.Invalidf("ready: exactly one of port and command")
		case r.Port < 0 || r.Port > 65535:
			return errdefs.Invalidf("ready.port: must be 1 to 65535, got %d", r.Port)
		case len(r.Command) > 8192 || strings.ContainsRune(r.Command, 0):
			return errdefs.Invalidf("ready.command: longer than 8192 bytes or holds NUL")
		// Compared in seconds: converted first, a huge value overflowed
		// time.Duration to a negative one that passed (found by
		// FuzzTemplateCreate).
		case r.TimeoutSeconds < 0 || r.TimeoutSeconds > int64(MaxReadyTimeout/time.Second):
			return errdefs.Invalidf("ready.timeout_seconds: must be 0 to %d, got %d", int(MaxReadyTimeout.Seconds()), r.TimeoutSeconds)
		}
	}
	if t.Pool < 0 || t.Pool > maxPool {
		return errdefs.Invalidf("pool: must be 0 to %d (sandbox.max_sandboxes), got %d", maxPool, t.Pool)
	}
	return nil
}
