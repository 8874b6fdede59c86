package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

func networkCmd(g *globals) *cobra.Command {
	var req client.SandboxNetworkRequest
	cmd := &cobra.Command{
		Use:   "network ID [--mode egress|allowlist] [--allow HOST ...]",
		Short: "Show or change a running sandbox's network policy and counters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.SandboxID = args[0]
			if !cmd.Flags().Changed("allow") {
				req.Allow = nil
			} else if req.Allow == nil {
				req.Allow = []string{}
			}
			st, err := c.SandboxNetwork(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(st)
			}
			fmt.Fprintf(g.stdout, "mode:     %s\n", st.Mode)
			fmt.Fprintf(g.stdout, "allow:    %s\n", strings.Join(st.Allow, " "))
			fmt.Fprintf(g.stdout, "allowed:  %d\n", st.Counters.Allowed)
			fmt.Fprintf(g.stdout, "denied:   %d\n", st.Counters.Denied)
			fmt.Fprintf(g.stdout, "denied destinations: %s\n", strings.Join(st.Counters.DeniedDestinations, " "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Mode, "mode", "", "new mode: egress or allowlist")
	f.StringArrayVar(&req.Allow, "allow", nil, "host, *.domain, IPv4 CIDR or @preset reachable in allowlist mode (repeatable)")
	return cmd
}
