package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// What only a screen or a guest boot can do (a VM is a sandbox: `create
// --backend vm`, and the sandbox commands work on it): screenshot and
// vm-test.

// screenshotCmd is `sandboxctl screenshot ID FILE.png`.
func screenshotCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "screenshot ID FILE.png",
		Short: "Save a screenshot of a sandbox's display (a VM's) as PNG (- for stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			png, err := c.Screenshot(cmd.Context(), args[0])
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
}

// vmTestCmd is `sandboxctl vm-test ...`.
func vmTestCmd(g *globals) *cobra.Command {
	var tr client.VMTestRequest
	var testFiles []string
	testC := &cobra.Command{
		Use:   "vm-test [--image python] [--file PATH]... [--setup CMD]... --test CMD...",
		Short: "Boot a clean VM, copy files into it, run setup and test commands, report each step",
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
				fmt.Fprintf(g.stdout, "passed: %v (run %s, sandbox %s)\n", r.Passed, r.RunID, r.SandboxID)
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
	return testC
}
