package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Templates: templates create|ls|inspect|rm; using one is
// create --template NAME.

func templatesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "templates",
		Aliases: []string{"template"},
		Short:   "Sandbox templates: an image, a start command ready on create, defaults, a warm pool",
	}
	cmd.AddCommand(templatesCreateCmd(g), templatesLsCmd(g), templatesInspectCmd(g), templatesRmCmd(g))
	return cmd
}

// templatesCreateCmd is templates create.
func templatesCreateCmd(g *globals) *cobra.Command {
	var (
		req           apitypes.TemplateCreateRequest
		memory, disk  string
		cpus          float64
		readyPort     int
		readyCmd      string
		readyTimeout  time.Duration
		envFlags      []string
		startCmd, img string
	)
	create := &cobra.Command{
		Use:   "create NAME --image L [--start CMD --ready-port P | --ready-cmd CMD] [--pool N] [flags]",
		Short: "Create a template and print its name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			req.Name, req.Image, req.StartCommand = args[0], img, startCmd
			if f.Changed("ready-port") || f.Changed("ready-cmd") {
				req.Ready = &apitypes.TemplateReady{Port: readyPort, Command: readyCmd}
				if f.Changed("ready-timeout") {
					s, err := seconds("ready-timeout", readyTimeout)
					if err != nil {
						return err
					}
					req.Ready.TimeoutSeconds = s
				}
			}
			if f.Changed("memory") {
				mb, err := parseMB("memory", memory)
				if err != nil {
					return err
				}
				req.MemoryMB = &mb
			}
			if f.Changed("disk") {
				mb, err := parseMB("disk", disk)
				if err != nil {
					return err
				}
				req.DiskMB = &mb
			}
			if f.Changed("cpus") {
				req.CPUs = &cpus
			}
			var err error
			if req.Env, err = parseKV("env", envFlags); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTemplate(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(t)
			}
			fmt.Fprintln(g.stdout, t.Name)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&img, "image", "", "image (language) the sandboxes run")
	f.StringVar(&startCmd, "start", "", "start command, run in the background in every sandbox of the template")
	f.IntVar(&readyPort, "ready-port", 0, "ready once this port inside the sandbox accepts a connection")
	f.StringVar(&readyCmd, "ready-cmd", "", "ready once this command exits 0")
	f.DurationVar(&readyTimeout, "ready-timeout", 0, "how long the start command may take to get ready (default 1m)")
	f.IntVar(&req.Pool, "pool", 0, "warm sandboxes kept ready")
	f.StringVar(&memory, "memory", "", "default memory limit, e.g. 512M")
	f.StringVar(&disk, "disk", "", "default disk, e.g. 1G")
	f.Float64Var(&cpus, "cpus", 0, "default CPU limit in cores")
	f.StringVar(&req.Network, "network", "", "default network mode: none, egress or allowlist")
	f.StringArrayVar(&req.Allow, "allow", nil, "with --network allowlist: host, *.domain, CIDR or @preset (repeatable)")
	f.StringArrayVarP(&envFlags, "env", "e", nil, "environment variable NAME=VALUE (repeatable)")
	return create
}

// templatesLsCmd is templates ls.
func templatesLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(apitypes.TemplateList{Templates: l})
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tIMAGE\tPOOL\tWARM\tSTART")
			for _, t := range l {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", t.Name, t.Image, t.Pool, t.Warm, t.StartCommand)
			}
			return tw.Flush()
		},
	}
}

// templatesInspectCmd is templates inspect.
func templatesInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME",
		Short: "Describe a template (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.GetTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.printJSON(t)
		},
	}
}

// templatesRmCmd is templates rm.
func templatesRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete templates (and their warm sandboxes)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return g.eachName(args, func(name string) error { return c.DeleteTemplate(cmd.Context(), name) })
		},
	}
}
