package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

func psCmd(g *globals) *cobra.Command {
	var (
		all   bool
		state string
	)
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List live sandboxes (--all: also terminated and failed ones)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all && state != "" {
				return usagef("ps: --all and --state are exclusive")
			}
			if all {
				state = "all"
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.ListSandboxes(cmd.Context(), state)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			return printSandboxes(g, l)
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include terminated and failed sandboxes")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (creating, ready, running, terminated, failed)")
	return cmd
}

func printSandboxes(g *globals, l []client.Sandbox) error {
	now := time.Now()
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX ID\tLANGUAGE\tSTATE\tCREATED\tMEMORY\tCPUS\tPIDS\tDISK\tNETWORK\tLABELS")
	for _, s := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%g\t%d\t%s\t%s\t%s\n", s.ID, s.Language, s.State, ago(now, s.CreatedAt),
			humanBytes(s.Limits.MemoryBytes), s.Limits.CPUs, s.Limits.Pids, humanBytes(s.Limits.DiskBytes), s.Network, labels(s.Labels))
	}
	return tw.Flush()
}

func labels(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	l := make([]string, 0, len(m))
	for k, v := range m {
		l = append(l, k+"="+v)
	}
	sort.Strings(l)
	return strings.Join(l, ",")
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID",
		Short: "Describe a sandbox and its live usage (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			// Like docker inspect: JSON is the human format too.
			return g.printJSON(d)
		},
	}
}

// createCmd is create: a sandbox from flags, its id printed.
func createCmd(g *globals) *cobra.Command {
	var o createOptions
	cmd := &cobra.Command{
		Use:   "create --lang L [flags] | create --backend vm [--os OS] [--image linux|LANG]",
		Short: "Create a sandbox and print its ID",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.apply(cmd.Flags()); err != nil {
				return err
			}
			req := o.req
			c, err := g.client()
			if err != nil {
				return err
			}
			var onLog func(string)
			if req.Backend == "vm" {
				// A VM's first use builds its guest image (minutes).
				onLog = func(line string) { fmt.Fprintf(g.stderr, "create: %s\n", line) }
			}
			s, err := c.CreateSandboxProgress(cmd.Context(), req, onLog)
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
	o.flags(cmd.Flags())
	return cmd
}

// createOptions are the flags of create.
type createOptions struct {
	req                  client.CreateSandboxRequest
	memory, disk         string
	bandwidth            string
	connRate             int64
	cpus                 float64
	pids, inodes         int64
	ttl                  time.Duration
	envFlags, labelFlags []string
	volumeFlags          []string
}

// flags declares create's flags on f.
func (o *createOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&o.req.Backend, "backend", "", "what runs the sandbox: container (default) or vm (a QEMU guest with its own kernel)")
	f.StringVar(&o.req.OS, "os", "", "with --backend vm: guest OS, linux (default) or windows (an administrator's disk, vm.images.windows)")
	f.StringVarP(&o.req.Language, "lang", "l", "", "language (image) of the sandbox (with --backend vm: the language's guest)")
	f.StringVar(&o.req.Image, "image", "", "image, when it differs from the language, or an OCI image reference (registry[:port]/name:tag, pulled on first use where images.allow_pull allows)")
	f.StringVar(&o.memory, "memory", "", "memory limit, e.g. 512M or 1G (default: the daemon's)")
	f.StringVar(&o.disk, "disk", "", "disk limit for /workspace and other writes, e.g. 1G")
	f.StringVar(&o.req.DiskBacking, "disk-backing", "", "where writes live: disk (an ext4 image) or memory (a tmpfs, counts against the memory limit)")
	f.Int64Var(&o.inodes, "inodes", 0, "limit of files and directories (default: one per 16K of disk)")
	f.Float64Var(&o.cpus, "cpus", 0, "CPU limit in cores, e.g. 0.5")
	f.Int64Var(&o.pids, "pids", 0, "process limit")
	f.StringVar(&o.req.Network, "network", "", "network mode: none, egress or allowlist")
	f.StringArrayVar(&o.req.Allow, "allow", nil, "host, *.domain, IPv4 CIDR or @preset reachable with --network allowlist (repeatable)")
	f.StringVar(&o.bandwidth, "network-bandwidth", "", "bandwidth per second in each direction with network, e.g. 1M (default: the daemon's)")
	f.Int64Var(&o.connRate, "network-conn-rate", 0, "new connections per second with network (default: the daemon's)")
	f.StringArrayVar(&o.req.Credentials, "credential", nil, "credential (network.credentials) the sandbox may use through the daemon's proxy, with --network egress or allowlist (repeatable)")
	f.StringArrayVarP(&o.envFlags, "env", "e", nil, "environment variable NAME=VALUE (repeatable)")
	f.StringArrayVar(&o.labelFlags, "label", nil, "label NAME=VALUE (repeatable)")
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime after which the sandbox is terminated, e.g. 30m")
	f.StringVar(&o.req.FromSnapshot, "from-snapshot", "", "start from a snapshot's files (a fork; the language is the snapshot's)")
	f.StringVar(&o.req.Template, "template", "", "start from a template: its image and defaults, its start command ready on return")
	f.StringArrayVar(&o.volumeFlags, "volume", nil, "mount a named volume, NAME:PATH or NAME:PATH:ro (repeatable)")
}

// apply puts the flags the user set into the request, each checked.
func (o *createOptions) apply(f *pflag.FlagSet) error {
	if f.Changed("memory") {
		mb, err := parseMB("memory", o.memory)
		if err != nil {
			return err
		}
		o.req.MemoryMB = &mb
	}
	if f.Changed("disk") {
		mb, err := parseMB("disk", o.disk)
		if err != nil {
			return err
		}
		o.req.DiskMB = &mb
	}
	if f.Changed("inodes") {
		o.req.Inodes = &o.inodes
	}
	if f.Changed("cpus") {
		o.req.CPUs = &o.cpus
	}
	if f.Changed("network-bandwidth") {
		b, err := config.ParseByteSize(o.bandwidth)
		if err != nil {
			return usagef("--network-bandwidth: %v", err)
		}
		n := int64(b)
		o.req.NetworkBandwidth = &n
	}
	if f.Changed("network-conn-rate") {
		o.req.NetworkConnRate = &o.connRate
	}
	if f.Changed("pids") {
		o.req.Pids = &o.pids
	}
	if f.Changed("ttl") {
		s, err := seconds("ttl", o.ttl)
		if err != nil {
			return err
		}
		o.req.TTLSeconds = &s
	}
	var err error
	if o.req.Env, err = parseKV("env", o.envFlags); err != nil {
		return err
	}
	if o.req.Labels, err = parseKV("label", o.labelFlags); err != nil {
		return err
	}
	if o.req.Volumes, err = parseVolumes(o.volumeFlags); err != nil {
		return err
	}
	return nil
}

func pauseCmd(g *globals) *cobra.Command {
	return stateChangeCmd(g, "pause ID", "Freeze every process of a sandbox (no CPU, no idle timeout) until resume", 1,
		func(c *client.Client, ctx context.Context, args []string) (*client.Sandbox, error) {
			return c.PauseSandbox(ctx, args[0])
		})
}

func resumeCmd(g *globals) *cobra.Command {
	return stateChangeCmd(g, "resume ID", "Thaw a paused sandbox", 1,
		func(c *client.Client, ctx context.Context, args []string) (*client.Sandbox, error) {
			return c.ResumeSandbox(ctx, args[0])
		})
}

// stateChangeCmd is a command that changes one sandbox (pause, resume,
// restore): call with its nargs arguments, print the sandbox's new state.
func stateChangeCmd(g *globals, use, short string, nargs int, call func(*client.Client, context.Context, []string) (*client.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(nargs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := call(c, cmd.Context(), args)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(s)
			}
			fmt.Fprintf(g.stdout, "%s %s\n", s.ID, s.State)
			return nil
		},
	}
}

func rmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] ID...",
		Short: "Terminate sandboxes (-f: even while a command runs)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var first error
			for _, id := range args {
				if err := removeSandbox(cmd, c, id, force); err != nil {
					if errors.Is(err, client.ErrUnreachable) {
						return err
					}
					fmt.Fprintf(g.stderr, "sandboxctl: rm %s: %v\n", id, err)
					if first == nil {
						first = err
					}
					continue
				}
				fmt.Fprintln(g.stdout, id)
			}
			if first != nil {
				// Already reported; keep only the first failure's exit code.
				return &exitStatus{code: exitCode(first)}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "terminate even when a command is running")
	return cmd
}

// removeSandbox terminates id. Like docker rm, it refuses a sandbox that is
// running a command unless forced.
func removeSandbox(cmd *cobra.Command, c *client.Client, id string, force bool) error {
	if !force {
		d, err := c.GetSandbox(cmd.Context(), id)
		if err != nil {
			return err
		}
		if d.State == "running" {
			return errors.New("a command is running; use -f to terminate anyway")
		}
	}
	_, err := c.TerminateSandbox(cmd.Context(), id)
	return err
}
