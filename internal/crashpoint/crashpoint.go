// Package crashpoint lets integration tests kill the daemon at a named step
// of its work, to prove that what a crash leaves behind is found again
// (the resource ledger, reconciliation, gc).
//
// It is inert unless the environment variable SANDBOXD_CRASH_AT names a
// point: only the test harness sets it. A hit kills the process with SIGKILL
// — no deferred cleanup runs, as in a real crash.
package crashpoint

import (
	"os"
	"sync"
	"syscall"
)

// EnvVar names the point at which the process kills itself.
const EnvVar = "SANDBOXD_CRASH_AT"

var target = sync.OnceValue(func() string { return os.Getenv(EnvVar) })

// Hit kills the process if point is the configured crash point.
func Hit(point string) {
	if t := target(); t != "" && t == point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is delivered before anything else runs
	}
}
