package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// vmCmd is `sandboxctl vm ...`: VMs through /v1/vms.
func vmCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "vm", Short: "Virtual machines (QEMU guests running the sandbox agent)"}

	var create client.VMCreateRequest
	var mem int64
	var cpus float64
	createCmd := &cobra.Command{
		Use:   "create [--os linux] [--image linux|LANG] [--memory-mb N] [--cpus N]",
		Short: "Start a VM and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("memory-mb") {
				create.MemoryMB = &mem
			}
			if cmd.Flags().Changed("cpus") {
				create.CPUs = &cpus
			}
			// Progress (a guest image built on first use, a disk guest
			// booting) goes to stderr; stdout has only the id.
			v, err := c.CreateVM(cmd.Context(), create, func(line string) { fmt.Fprintf(g.stderr, "vm: %s\n", line) })
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(v)
			}
			fmt.Fprintln(g.stdout, v.ID)
			return nil
		},
	}
	f := createCmd.Flags()
	f.StringVar(&create.OS, "os", "", "guest OS: linux (default) or windows (an administrator's disk, vm.images.windows)")
	f.StringVar(&create.Image, "image", "", "guest image: linux (default) or a language made into a guest (python)")
	f.Int64Var(&mem, "memory-mb", 0, "guest RAM in MiB")
	f.Float64Var(&cpus, "cpus", 0, "virtual CPUs")

	var state string
	lsCmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List VMs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			vms, err := c.ListVMs(cmd.Context(), state)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(vms)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tMEMORY\tCPUS\tACCEL\tCREATED")
			for _, v := range vms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\n", v.ID, v.State, v.Image, humanBytes(v.Limits.MemoryBytes),
					v.Limits.CPUs, v.Accel, ago(now, v.CreatedAt))
			}
			return tw.Flush()
		},
	}
	lsCmd.Flags().StringVar(&state, "state", "", "only VMs in this state (all for every state)")

	inspect := &cobra.Command{
		Use:   "inspect ID",
		Short: "Describe a VM (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.GetVM(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.printJSON(v)
		},
	}

	rm := &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"destroy"},
		Short:   "Destroy VMs",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if _, err := c.DestroyVM(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, id)
			}
			return nil
		},
	}

	var xo execOptions
	var shellLine string
	execC := &cobra.Command{
		Use:   "exec [--timeout D] [--env K=V] [--cwd DIR] ID (-c 'SHELL LINE' | -- CMD ARGS...)",
		Short: "Run a command in a VM and exit with its exit code",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv := args[0], args[1:]
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:]
			}
			switch {
			case shellLine != "" && len(argv) > 0:
				return usagef("vm exec: give -c or a command after the VM ID, not both")
			case shellLine == "" && len(argv) == 0:
				return usagef("vm exec: missing command after the VM ID")
			}
			env, err := parseKV("env", xo.env)
			if err != nil {
				return err
			}
			req, err := xo.request(argv, env)
			if err != nil {
				return err
			}
			if shellLine != "" {
				req.Argv, req.Command = nil, shellLine
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.VMExec(cmd.Context(), id, req, g.streamOutput())
			if err != nil {
				return err
			}
			return g.commandResult(res)
		},
	}
	ef := execC.Flags()
	ef.SetInterspersed(false)
	ef.StringVarP(&shellLine, "command", "c", "", "a shell command line (/bin/sh -c; cmd.exe on a Windows guest) instead of CMD ARGS")
	ef.DurationVar(&xo.timeout, "timeout", 0, "kill the command after this long")
	ef.StringArrayVarP(&xo.env, "env", "e", nil, "environment variable NAME=VALUE (repeatable)")
	ef.StringVarP(&xo.cwd, "cwd", "w", "", "working directory (default /workspace)")

	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a VM (ID:/path on one side, - for stdin/stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			src, dst := args[0], args[1]
			if id, p, ok := vmRef(src); ok {
				out := io.Writer(g.stdout)
				if dst != "-" {
					f, err := os.Create(dst)
					if err != nil {
						return err
					}
					defer f.Close()
					out = f
				}
				_, err := c.VMReadFile(cmd.Context(), id, p, 0, 0, out)
				return err
			}
			id, p, ok := vmRef(dst)
			if !ok {
				return usagef("vm cp: one side must be ID:/path")
			}
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			_, err = c.VMWriteFile(cmd.Context(), id, p, uint32(st.Mode().Perm()), st.Size(), f)
			return err
		},
	}

	snapshot := vmSnapshotCmd(g, "snapshot ID NAME", "Save a VM's whole state under NAME", (*client.Client).SnapshotVM)
	restore := vmSnapshotCmd(g, "restore ID NAME", "Return a VM to snapshot NAME", (*client.Client).RestoreVM)
	screenshot := &cobra.Command{
		Use:   "screenshot ID FILE.png",
		Short: "Save a screenshot of a VM's display as PNG (- for stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			png, err := c.ScreenshotVM(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if args[1] == "-" {
				_, err = g.stdout.Write(png)
				return err
			}
			return os.WriteFile(args[1], png, 0o644)
		},
	}

	var tr client.VMTestRequest
	var testFiles []string
	testC := &cobra.Command{
		Use:   "test [--image python] [--file PATH]... [--setup CMD]... --test CMD...",
		Short: "Copy files into a clean VM, run setup and test commands, report each step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			tr.Files = map[string]string{}
			for _, p := range testFiles {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				tr.Files[p] = string(b)
			}
			r, err := c.VMTest(cmd.Context(), tr)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(r); err != nil {
					return err
				}
			} else {
				for _, st := range r.Steps {
					fmt.Fprintf(g.stdout, "%s\t%s\texit %d\t%dms\n", st.Phase, st.Command, st.ExitCode, st.DurationMS)
					if st.ExitCode != 0 {
						fmt.Fprint(g.stdout, st.Stdout, st.Stderr)
					}
				}
				fmt.Fprintf(g.stdout, "passed: %v (run %s, vm %s)\n", r.Passed, r.RunID, r.VMID)
			}
			if !r.Passed {
				return &exitStatus{code: 1}
			}
			return nil
		},
	}
	tf := testC.Flags()
	tf.StringVar(&tr.OS, "os", "", "guest OS: linux (default) or windows (an administrator's disk, vm.images.windows)")
	tf.StringVar(&tr.Image, "image", "", "guest image: linux (default) or a language guest (python)")
	tf.StringArrayVar(&testFiles, "file", nil, "a file copied to /workspace under its relative path (repeatable)")
	tf.StringArrayVar(&tr.Setup, "setup", nil, "setup command line (repeatable)")
	tf.StringArrayVar(&tr.Test, "test", nil, "test command line (repeatable)")
	tf.BoolVar(&tr.Keep, "keep", false, "keep the VM afterwards")

	cmd.AddCommand(createCmd, lsCmd, inspect, rm, execC, cp, snapshot, restore, screenshot, testC)
	return cmd
}

// vmRef splits ID:/path.
func vmRef(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || id == "" || !strings.HasPrefix(path, "/") {
		return "", "", false
	}
	return id, path, true
}

// vmSnapshotCmd is vm snapshot or restore: call with a VM and a snapshot
// name, print the outcome.
func vmSnapshotCmd(g *globals, use, short string, call func(*client.Client, context.Context, string, string) (*client.VMSnapshotResult, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := call(c, cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(r)
			}
			fmt.Fprintf(g.stdout, "%s\t%s\t%dms\n", r.VMID, r.Name, r.DurationMS)
			return nil
		},
	}
}
