// Command sandbox-init is every container's `runc init`: the process that
// libcontainer starts to set up a sandbox's namespaces, mounts, cgroups,
// capabilities and seccomp filter before it execs the sandbox's PID 1 (the
// agent). libcontainer always re-executes the daemon for this; the daemon's
// C constructor (pkg/runtime/initexec.go) hands the job to this small binary
// instead, so that a start does not pay the daemon's Go runtime and ~490
// package initialisers (about 16 ms) inside every new sandbox.
//
// It imports only libcontainer (and its nsenter constructor, which runs
// before the Go runtime). It runs only from the sealed memfd copy the daemon
// made at start (docs/security.md, "runc init"), never from its path on disk.
package main

import (
	"fmt"
	"os"

	"github.com/opencontainers/runc/libcontainer"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // cgo constructor: namespaces before the Go runtime
)

func main() {
	// The same guard as the daemon's MaybeInit: without libcontainer's
	// init pipe there is nothing to set up.
	if len(os.Args) > 1 && os.Args[1] == "init" && os.Getenv("_LIBCONTAINER_INITPIPE") != "" {
		libcontainer.Init() // never returns
	}
	fmt.Fprintln(os.Stderr, "sandbox-init: started by mcp-sandboxd as a container's init only")
	os.Exit(2)
}
