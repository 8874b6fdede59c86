package main

import "github.com/spf13/cobra"

// extraCommands are the daemon's long-running commands (serve, stdio).
func extraCommands() []*cobra.Command { return nil }
