package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// uiCmd prints a one-time login URL of the web editor, alone on stdout so
// that scripts can open it (xdg-open "$(sandboxctl ui)").
func uiCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ui",
		Short: "Print a one-time login URL for the web editor (valid 10 minutes, for one login)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.MintLoginURL(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			_, err = fmt.Fprintln(g.stdout, l.URL)
			return err
		},
	}
}
