package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// agentCmd is agent_run: `sandboxctl agent -p PROMPT [FILE...]`. Files keep
// their base names in /workspace; with --out the final files are written
// to a directory. The session's progress streams to stderr as
// "agent: ..." lines while it runs.
func agentCmd(g *globals) *cobra.Command {
	var (
		prompt, image, outDir string
		maxTurns              int
		quiet, showDiff       bool
		timeout               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "agent -p PROMPT [--out DIR] [FILE...]",
		Short: "Run a coding agent (Claude Code) on files in a sandbox; the API key stays with the daemon",
		RunE: func(cmd *cobra.Command, files []string) error {
			if prompt == "" {
				return usagef("-p/--prompt is required")
			}
			req := apitypes.AgentRunRequest{Prompt: prompt, Language: image, MaxTurns: maxTurns, TimeoutSeconds: timeout.Seconds(), Files: map[string]string{}}
			for _, f := range files {
				data, err := readLimited(f, maxRunFile)
				if err != nil {
					return usageErr(err)
				}
				req.Files[filepath.Base(f)] = string(data)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.AgentRun(cmd.Context(), req, func(p apitypes.AgentProgress) {
				if !quiet {
					fmt.Fprintf(g.stderr, "agent: %s\n", p)
				}
			})
			if err != nil {
				return err
			}
			if outDir != "" {
				for p, content := range res.Files {
					dst := filepath.Join(outDir, filepath.FromSlash(p))
					if !filepath.IsLocal(p) {
						continue
					}
					if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
						return err
					}
					if err := os.WriteFile(dst, []byte(content), 0o644); err != nil {
						return err
					}
				}
			}
			if g.json {
				return g.printJSON(res)
			}
			for _, ch := range res.Changes {
				fmt.Fprintf(g.stdout, "%-8s %s\n", ch.Status, ch.Path)
			}
			if showDiff {
				fmt.Fprint(g.stdout, res.Diff)
			}
			fmt.Fprintf(g.stdout, "%s\n", res.Summary)
			fmt.Fprintf(g.stderr, "--- success %v %s; %d turns, %d requests, %d+%d tokens; run %s, transcript %s\n",
				res.Success, res.Cause, res.NumTurns, res.Usage.Requests, res.Usage.InputTokens, res.Usage.OutputTokens, res.RunID, res.Transcript)
			if !res.Success {
				return &exitStatus{code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&prompt, "prompt", "p", "", "the task for the agent")
	f.StringVar(&image, "image", "", "image with the Claude Code CLI (default: agent)")
	f.StringVar(&outDir, "out", "", "write the final files into this directory")
	f.IntVar(&maxTurns, "max-turns", 0, "most agent turns (default 20)")
	f.BoolVarP(&quiet, "quiet", "q", false, "do not print the session's progress (tool calls, changed files) on stderr")
	f.BoolVar(&showDiff, "diff", false, "print the unified diff of the text files after the changes")
	f.DurationVar(&timeout, "timeout", 0, "time the session may take (default 10m)")
	return cmd
}
