package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// runsReplayCmd is `sandboxctl runs replay RUN_ID`: the run again in a
// fresh sandbox, and its diff against the original. Like diff(1) it exits
// 0 when the runs are the same and 1 when they differ.
func runsReplayCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "replay RUN_ID",
		Short: "Run a recorded run again (same image digest, inputs and limits) and show how it differs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.ReplayRun(cmd.Context(), apitypes.RunReplayRequest{RunID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(rep); err != nil {
					return err
				}
			} else {
				printReplay(g.stdout, rep)
			}
			if !rep.Diff.Same {
				return &exitStatus{code: 1}
			}
			return nil
		},
	}
}

// printReplay writes a replay as a reader of diff(1) expects it: a header,
// then each difference.
func printReplay(w io.Writer, rep *apitypes.RunReplay) {
	fmt.Fprintf(w, "replay     %s of %s\n", rep.Replay.RunID, rep.Original)
	if rep.Note != "" {
		fmt.Fprintf(w, "note       %s\n", rep.Note)
	}
	d := rep.Diff
	if d.Same {
		fmt.Fprintln(w, "same       exit code, stdout, stderr and output files")
		return
	}
	if d.ExitCode != nil {
		fmt.Fprintf(w, "exit code  %d -> %d\n", d.ExitCode.Original, d.ExitCode.Replay)
	}
	_, _ = io.WriteString(w, d.Stdout)
	_, _ = io.WriteString(w, d.Stderr)
	for _, f := range d.Files {
		switch {
		case f.Binary:
			fmt.Fprintf(w, "output     %s %s (binary): %s -> %s\n", f.Path, f.Change, sideOf(f.OriginalSize, f.OriginalSHA256), sideOf(f.ReplaySize, f.ReplaySHA256))
		default:
			_, _ = io.WriteString(w, f.Diff)
		}
	}
}

// sideOf describes one side of a binary file's change.
func sideOf(size *int64, sum string) string {
	if size == nil {
		return "none"
	}
	return fmt.Sprintf("%d bytes sha256:%s", *size, sum)
}
