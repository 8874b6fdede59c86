// Package version holds build information stamped in by the linker.
package version

// Set with -ldflags -X at build time (see the Makefile).
var (
	Version = "dev"
	Commit  = "unknown"
)
