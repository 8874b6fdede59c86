package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// autofixCmd is `sandboxctl autofix --lang L FILE...`: the autofix loop
// with a provider of the daemon, each attempt printed as it happens, then
// the diff of the original code to the final one. The first file is the
// entrypoint; files keep their base names in /workspace.
func autofixCmd(g *globals) *cobra.Command {
	var (
		lang, provider, success, testCmd string
		maxRetries                       int
		timeout                          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "autofix --lang L FILE [FILE...]",
		Short: "Run code and let the configured fixer repair it until it works (autofix loop)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			if lang == "" {
				return usagef("--lang is required")
			}
			progFiles, entry, err := readProgram(files)
			if err != nil {
				return err
			}
			req := client.AutofixRequest{Language: lang, Files: progFiles, Entrypoint: entry, Provider: provider,
				Success: success, TestCommand: testCmd}
			if cmd.Flags().Changed("max-retries") {
				req.MaxRetries = &maxRetries
			}
			if timeout > 0 {
				s := timeout.Seconds()
				req.TimeoutSeconds = &s
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Autofix(cmd.Context(), req, func(ev client.AutofixEvent) {
				if g.json || ev.Attempt == nil {
					return
				}
				a := ev.Attempt
				switch {
				case ev.Type == "fix":
					fmt.Fprintf(g.stderr, "    fix by %s: %s\n", a.Provider, a.FixSummary)
				case a.Success:
					fmt.Fprintf(g.stderr, "attempt %d: ok (%dms)\n", a.Attempt, a.DurationMS)
				default:
					fmt.Fprintf(g.stderr, "attempt %d: exit %d (%s, %dms): %s\n", a.Attempt, a.ExitCode, a.Termination.Cause, a.DurationMS, a.ErrorExcerpt)
				}
			})
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(g.stderr, "--- autofix %s (run %s): %s after %d attempt(s)", res.AutofixID, res.RunID, res.Status, res.Attempts)
				if res.StopReason != "" && res.StopReason != "success" {
					fmt.Fprintf(g.stderr, ", stopped: %s: %s", res.StopReason, res.Error)
				}
				fmt.Fprintln(g.stderr)
				if res.Status == "needs_fix" {
					fmt.Fprintf(g.stderr, "the provider is client: answer with an MCP client (autofix_submit {autofix_id: %q}) or POST /v1/autofix/%s/submit\n", res.AutofixID, res.AutofixID)
				}
				fmt.Fprint(g.stdout, res.Diff)
			}
			if !res.Success {
				return &exitStatus{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&lang, "lang", "l", "", "language (sandboxctl languages)")
	cmd.Flags().StringVar(&provider, "provider", "", "fixer among those configured: anthropic, command, client (default: autofix.provider)")
	cmd.Flags().StringVar(&success, "success", "", "exit_zero_and_empty_stderr, exit_zero or tests (default: autofix.success)")
	cmd.Flags().StringVar(&testCmd, "test-command", "", "with --success tests: shell command to run instead of the language's test task")
	cmd.Flags().IntVar(&maxRetries, "max-retries", 0, "fix requests after the first run (default: autofix.max_retries)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "time limit of the whole loop (default: autofix.timeout)")
	return cmd
}

// runsExportCmd is `sandboxctl runs export --format jsonl`: the autofix
// corrections (language, code, error, fix, outcome) as JSON lines.
func runsExportCmd(g *globals) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "export [--format jsonl]",
		Short: "Write the autofix corrections (language, code, error, fix, outcome) as JSON lines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "jsonl" {
				return usagef("--format: only jsonl")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.ExportCorrections(cmd.Context(), g.stdout)
		},
	}
	cmd.Flags().StringVar(&format, "format", "jsonl", "output format (jsonl)")
	return cmd
}
