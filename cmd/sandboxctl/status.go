package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's version, uptime, host support and sandbox counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(st)
			}
			return printStatus(g.stdout, st)
		},
	}
}

func printStatus(w io.Writer, st *client.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Version:\t%s (%s)\n", st.Version, st.Commit)
	fmt.Fprintf(tw, "Uptime:\t%s\n", (time.Duration(st.UptimeS) * time.Second).String())
	fmt.Fprintf(tw, "Ready:\t%s\n", yesNo(st.Ready))
	fmt.Fprintf(tw, "Cgroups:\t%s\n", st.Cgroups)
	fmt.Fprintf(tw, "Seccomp:\t%s\n", yesNo(st.Seccomp))
	fmt.Fprintf(tw, "Landlock:\t%s (kernel ABI %d)\n", yesNo(st.Landlock), st.LandlockABI)
	var counts []string
	for _, s := range []string{"creating", "ready", "running", "paused", "terminated", "failed"} {
		counts = append(counts, fmt.Sprintf("%s=%d", s, st.Sandboxes[s]))
	}
	fmt.Fprintf(tw, "Sandboxes:\t%s (max %d live)\n", strings.Join(counts, " "), st.MaxSandboxes)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printChecks(w, st.Checks)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printChecks(w io.Writer, checks []client.Check) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tREQUIRED\tREASON")
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Name, c.Status, yesNo(c.Required), c.Reason)
	}
	return tw.Flush()
}

func healthCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Run the daemon's readiness checks; exit 5 when it is not ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.Readiness(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				err = g.printJSON(r)
			} else {
				fmt.Fprintf(g.stdout, "%s\n\n", r.Status)
				err = printChecks(g.stdout, r.Checks)
			}
			if err != nil {
				return err
			}
			if r.Status != client.StatusReady {
				return &exitStatus{code: exitUnhealthy}
			}
			return nil
		},
	}
}
