package main

import "github.com/spf13/cobra"

// extraCommands are the daemon's long-running commands.
func extraCommands() []*cobra.Command { return []*cobra.Command{serveCmd(), imagesCmd()} }
