// Command mcp-sandboxd is the SandboxRunner daemon: it runs sandboxes for AI
// agents (MCP) and administrators (REST, sandboxctl). See docs/SPEC.md for its
// commands.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// init turns this process into a sandbox's container init when libcontainer
// re-executes the daemon for that purpose ("mcp-sandboxd init" with
// _LIBCONTAINER_INITPIPE set). It must run before anything else does work:
// it never returns in that case.
func init() {
	runtime.MaybeInit()
}

func main() {
	root := &cobra.Command{
		Use:           "mcp-sandboxd",
		Short:         "Code-execution sandboxes for AI agents (MCP) and administrators (REST)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(versionCmd(), configCmd())
	root.AddCommand(extraCommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-sandboxd:", err)
		os.Exit(exitCode(err))
	}
}

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func exitCode(err error) int {
	if e, ok := err.(*exitError); ok {
		return e.code
	}
	return 1
}
