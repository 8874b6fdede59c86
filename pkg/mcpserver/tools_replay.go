package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// run_replay (group run): a recorded run re-run and compared with the
// original, over Options.Replays.

type runReplayOut = apitypes.RunReplay

func (s *srv) addReplayTool() {
	if s.opt.Replays == nil {
		return
	}
	addTool[apitypes.RunReplayRequest, runReplayOut](s, "run_replay", "Replay a run",
		joinLines(
			"Run a recorded run again (run_list, run_get) in a fresh sandbox: the same image digest, files, entrypoint, args, stdin, env, time limit and sandbox limits. The new run is recorded (its metadata's replayOf names the original) and compared with the original: diff.same, and otherwise the exit codes, unified diffs of stdout and stderr, and the output files that differ (a unified diff for text, sizes and SHA-256s for binary files).",
			"Use it to check that a run is reproducible, or that a fix still fixes. Only run_code runs replay (not autofix loops or agent sessions, nor VM runs). A run whose image digest was pruned since cannot replay (failed_precondition names the digest).",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.RunReplayRequest) (*result, error) {
			rep, err := s.opt.Replays.ReplayRun(ctx, *in)
			if err != nil {
				return nil, err
			}
			return s.replayResult(rep), nil
		})
}

// replayResult fits a replay into the result budget: the diff first (it is
// what was asked), then the new run's output, each cut in the middle with
// a pointer to where it is kept whole.
func (s *srv) replayResult(rep *apitypes.RunReplay) *result {
	where := fmt.Sprintf("run_get {run_id: %q} and run_get {run_id: %q} hold both runs whole", rep.Original, rep.Replay.RunID)
	summary := replaySummary(rep)
	return s.fit(func(limit int) *result {
		out := *rep
		d := rep.Diff
		d.Files = append([]apitypes.FileDiff(nil), rep.Diff.Files...)
		share := limit / 2 / (2 + len(d.Files))
		d.Stdout, _ = cut(d.Stdout, share, where)
		d.Stderr, _ = cut(d.Stderr, share, where)
		for i := range d.Files {
			d.Files[i].Diff, _ = cut(d.Files[i].Diff, share, where)
		}
		out.Diff = d
		r := rep.Replay
		r.Steps = nil // the top level is the run step; run_get has them all
		lo, le := split(limit/2, len(r.Stdout), len(r.Stderr))
		var c1, c2 bool
		r.Stdout, c1 = cut(r.Stdout, lo, where)
		r.Stderr, c2 = cut(r.Stderr, le, where)
		r.StdoutTruncated, r.StderrTruncated = r.StdoutTruncated || c1, r.StderrTruncated || c2
		out.Replay = r
		return &result{structured: out, text: summary}
	})
}

// replaySummary is the replay's outcome in a line or two.
func replaySummary(rep *apitypes.RunReplay) string {
	d := rep.Diff
	if d.Same {
		return fmt.Sprintf("run %s replayed as %s: same exit code, output and output files", rep.Original, rep.Replay.RunID)
	}
	var parts []string
	if d.ExitCode != nil {
		parts = append(parts, fmt.Sprintf("exit code %d -> %d", d.ExitCode.Original, d.ExitCode.Replay))
	}
	if d.Stdout != "" {
		parts = append(parts, "stdout differs")
	}
	if d.Stderr != "" {
		parts = append(parts, "stderr differs")
	}
	if n := len(d.Files); n > 0 {
		parts = append(parts, fmt.Sprintf("%d output files differ", n))
	}
	return fmt.Sprintf("run %s replayed as %s: %s", rep.Original, rep.Replay.RunID, strings.Join(parts, "; "))
}
