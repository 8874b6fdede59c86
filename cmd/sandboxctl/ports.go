package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func portCmd(g *globals) *cobra.Command {
	var unexpose bool
	cmd := &cobra.Command{
		Use:   "port ID [PORT] [--unexpose]",
		Short: "Serve a sandbox's port on the preview listener and print its URL; without PORT, list the exposed ports",
		Long: "port ID PORT exposes the sandbox's TCP port PORT (HTTP and WebSocket) on the daemon's preview\n" +
			"listener and prints a URL that opens it in a browser (it carries the exposure's token once).\n" +
			"Programs send the token in the X-Sandboxd-Preview-Token header instead (see --json).\n" +
			"port ID lists the exposures; port ID PORT --unexpose ends one. Exposures end with the sandbox.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			id := args[0]
			if len(args) == 1 {
				if unexpose {
					return errdefs.Invalidf("port: required with --unexpose")
				}
				xs, err := c.Ports(cmd.Context(), id)
				if err != nil {
					return err
				}
				if g.json {
					return g.printJSON(xs)
				}
				for _, x := range xs {
					fmt.Fprintf(g.stdout, "%d\t%s\n", x.Port, x.URL)
				}
				return nil
			}
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return errdefs.Invalidf("port: %q is not a number", args[1])
			}
			if unexpose {
				return c.UnexposePort(cmd.Context(), id, port)
			}
			x, err := c.ExposePort(cmd.Context(), id, port)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(x)
			}
			fmt.Fprintln(g.stdout, x.URL)
			return nil
		},
	}
	cmd.Flags().BoolVar(&unexpose, "unexpose", false, "end the exposure of PORT")
	return cmd
}
