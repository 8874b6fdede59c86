package main

import (
	"encoding/json"
	"errors"
	"fmt"
	goruntime "runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

func versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print version, commit, libcontainer version, seccomp and cgroup mode",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc := seccomp.Check()
			info := map[string]any{
				"version":      version.Version,
				"commit":       version.Commit,
				"go":           goruntime.Version(),
				"libcontainer": moduleVersion("github.com/opencontainers/runc"),
				"seccomp":      map[string]any{"enabled": sc.OK(), "build": sc.Build, "kernel": sc.Kernel, "reason": sc.Reason},
				"cgroups":      string(cgroups.HostMode()),
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			seccompState := "enabled"
			if !sc.OK() {
				seccompState = "unavailable: " + sc.Reason
			}
			fmt.Fprintf(cmd.OutOrStdout(), "mcp-sandboxd %s (commit %s, %s)\nlibcontainer %s\nseccomp %s\ncgroups %s\n",
				version.Version, version.Commit, goruntime.Version(), info["libcontainer"], seccompState, info["cgroups"])
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "unknown"
}

func configCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Check or print the configuration"}
	cmd.AddCommand(&cobra.Command{
		Use:   "validate FILE",
		Short: "Check a configuration file; every error names its key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := config.Load(args[0]); err != nil {
				var ve *config.ValidationError
				if errors.As(err, &ve) {
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					return &exitError{code: 2, err: fmt.Errorf("%s is not valid", args[0])}
				}
				return &exitError{code: 2, err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid\n", args[0])
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "default",
		Short: "Print the documented default configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), config.DefaultYAML)
			return err
		},
	})
	return cmd
}
