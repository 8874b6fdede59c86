package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Named volumes: volumes create|ls|inspect|rm; mounting is
// create --volume NAME:PATH[:ro].

func volumesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volumes",
		Aliases: []string{"volume"},
		Short:   "Named volumes: disk that outlives sandboxes",
	}
	cmd.AddCommand(volumesCreateCmd(g), volumesLsCmd(g), volumesInspectCmd(g), volumesRmCmd(g))
	return cmd
}

// volumesCreateCmd is the create subcommand of volumesCmd.
func volumesCreateCmd(g *globals) *cobra.Command {
	var (
		size   string
		inodes int64
	)
	create := &cobra.Command{
		Use:   "create NAME [--size 1G] [--inodes N]",
		Short: "Create a named volume and print its name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := apitypes.VolumeCreateRequest{Name: args[0]}
			if cmd.Flags().Changed("size") {
				mb, err := parseMB("size", size)
				if err != nil {
					return err
				}
				req.SizeMB = &mb
			}
			if cmd.Flags().Changed("inodes") {
				req.Inodes = &inodes
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(v)
			}
			fmt.Fprintln(g.stdout, v.Name)
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "", "size, e.g. 512M or 4G (default: the daemon's volumes.default_size)")
	create.Flags().Int64Var(&inodes, "inodes", 0, "limit of files and directories (default: one per 16K)")
	return create
}

// volumesLsCmd is the ls subcommand of volumesCmd.
func volumesLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List named volumes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(apitypes.VolumeList{Volumes: l})
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tTENANT\tCREATED\tMOUNTED BY")
			for _, v := range l {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, humanBytes(v.SizeBytes), humanBytes(v.UsedBytes), v.Tenant,
					ago(now, v.CreatedAt), strings.Join(v.UsedBy, ","))
			}
			return tw.Flush()
		},
	}
}

// volumesInspectCmd is the inspect subcommand of volumesCmd.
func volumesInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME",
		Short: "Describe a named volume (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.printJSON(v)
		},
	}
}

// volumesRmCmd is the rm subcommand of volumesCmd.
func volumesRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete named volumes and their files (refused while a live sandbox mounts one)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return g.eachName(args, func(name string) error { return c.DeleteVolume(cmd.Context(), name) })
		},
	}
}

// parseVolumes reads --volume NAME:PATH[:ro|:rw] flags.
func parseVolumes(flags []string) ([]apitypes.VolumeMount, error) {
	var out []apitypes.VolumeMount
	for _, f := range flags {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, usagef("--volume: %q is not NAME:PATH[:ro]", f)
		}
		m := apitypes.VolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				m.ReadOnly = true
			case "rw":
			default:
				return nil, usagef("--volume: %q: the mode is ro or rw, got %q", f, parts[2])
			}
		}
		out = append(out, m)
	}
	return out, nil
}
