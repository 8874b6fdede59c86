package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// nodesCmd is `sandboxctl nodes`: a gateway's nodes (--url of a gateway).
func nodesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List a gateway's nodes and their capacity (--url of an mcp-sandboxd gateway)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tURL\tSTATE\tLIVE\tMAX\tVM")
			for _, n := range l.Nodes {
				if !n.Reachable {
					fmt.Fprintf(tw, "%s\t%s\tunreachable: %s\t-\t-\t-\n", n.Name, n.URL, n.Error)
					continue
				}
				state := "ready"
				switch {
				case n.Status.Draining:
					state = "draining"
				case !n.Status.Ready:
					state = "not ready"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", n.Name, n.URL, state, n.Status.Live, n.Status.MaxSandboxes, yesNo(n.Status.VM))
			}
			return tw.Flush()
		},
	}
	for _, d := range []struct {
		use, short string
		draining   bool
	}{
		{"drain NAME", "Stop placing creates on a node (its sandboxes keep running)", true},
		{"undrain NAME", "Place creates on a drained node again", false},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: d.use, Short: d.short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				st, err := c.DrainNode(cmd.Context(), args[0], d.draining)
				if err != nil {
					return err
				}
				if g.json {
					return g.printJSON(st)
				}
				fmt.Fprintf(g.stdout, "%s: draining %s, %d live sandboxes\n", args[0], yesNo(st.Draining), st.Live)
				return nil
			},
		})
	}
	return cmd
}
