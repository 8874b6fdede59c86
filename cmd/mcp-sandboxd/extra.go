package main

import "github.com/spf13/cobra"

// extraCommands are the daemon's long-running and maintenance commands.
func extraCommands() []*cobra.Command {
	return []*cobra.Command{serveCmd(), stdioCmd(), imagesCmd(), gatewayCmd()}
}
