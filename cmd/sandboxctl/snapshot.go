package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/spf13/cobra"
)

// Workspace snapshots: snapshot, restore, snapshots ls|rm; a fork is
// create --from-snapshot.

func snapshotCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot ID [--name N]",
		Short: "Save a sandbox's files (/workspace, /tmp, root file system changes) and print the snapshot's id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.SnapshotSandbox(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(s)
			}
			fmt.Fprintln(g.stdout, s.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name of the snapshot (letters, digits, ._-)")
	return cmd
}

func restoreCmd(g *globals) *cobra.Command {
	return stateChangeCmd(g, "restore ID SNAPSHOT", "Roll a sandbox back to a snapshot (its running commands are killed)", 2,
		func(c *client.Client, ctx context.Context, args []string) (*client.Sandbox, error) {
			return c.RestoreSandbox(ctx, args[0], args[1])
		})
}

func snapshotsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshots",
		Short: "Workspace snapshots",
	}
	var sandboxID string
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Snapshots(cmd.Context(), sandboxID)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SNAPSHOT\tNAME\tSANDBOX\tLANGUAGE\tSIZE\tFILES\tCREATED\tEXPIRES")
			for _, s := range l {
				exp := "never"
				if s.ExpiresAt != nil {
					exp = "in " + s.ExpiresAt.Sub(now).Round(time.Minute).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, s.SandboxID, s.Language,
					humanBytes(s.Size), humanBytes(s.ContentSize), ago(now, s.CreatedAt), exp)
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&sandboxID, "sandbox", "", "only snapshots of this sandbox")
	cmd.AddCommand(ls, &cobra.Command{
		Use:     "rm SNAPSHOT...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots and their archives",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return g.eachName(args, func(name string) error { return c.DeleteSnapshot(cmd.Context(), name) })
		},
	})
	return cmd
}
