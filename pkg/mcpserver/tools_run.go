package mcpserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// runCodeIn is the contract's request: a new run_code field is added in
// pkg/apitypes only.
type runCodeIn = apitypes.RunCodeRequest

type runCodeOut = apitypes.RunResult

type runTaskIn = apitypes.RunTaskRequest

type packagesIn = apitypes.PackagesInstallRequest

type runGetIn struct {
	RunID string `json:"run_id" jsonschema_description:"Run id from run_code or run_list."`
}

type runGetOut = apitypes.RunRecord

type runListIn struct {
	Limit    int    `json:"limit,omitempty" jsonschema_description:"Most runs to list, newest first (default 50, at most 1000)."`
	Language string `json:"language,omitempty" jsonschema_description:"Only runs of this language."`
	Success  *bool  `json:"success,omitempty" jsonschema_description:"Only successful (true) or failed (false) runs."`
}

type runListOut = apitypes.RunList

func (s *srv) addRunTools() {
	addTool[runCodeIn, runCodeOut](s, "run_code", "Run code",
		joinLines(
			"Run a program: write the files into a sandbox, install dependencies found in them, compile (compiled languages) and run. Returns run_id, sandbox_id, success, every step (install/compile/run) with exit_code, stdout, stderr, termination and duration, and at the top level the last step that ran (the run step, or the step that failed, e.g. a compile error).",
			"Prerequisite: a language from languages_list. Without sandbox_id a fresh sandbox (no network) is created and removed afterwards; with sandbox_id the files stay in that sandbox's /workspace. Files the program writes to /workspace/output are kept in the run record (output_files).",
			fmt.Sprintf("Limits: %s for the whole run. Output longer than this tool's result size is cut in the middle; the run record keeps it (run_get). With a progress token, output is sent as progress notifications while the run goes on.", s.limits()),
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *runCodeIn) (*result, error) {
			return s.watchRefusals(ctx, in.SandboxID, func(ctx context.Context) (*result, error) {
				res, err := s.e.RunCode(ctx, *in, c.progress.outputFunc())
				if err != nil {
					return nil, err
				}
				return s.runResult(res), nil
			})
		})

	addTool[runTaskIn, execOut](s, "run_task", "Lint, build or test",
		joinLines(
			"Run the tests, the lint or the build: the sandbox language's configured test, lint or build command on /workspace (or on path) and wait for it; returns like exec_command.",
			fmt.Sprintf("Prerequisite: a live sandbox_id whose language has the task (languages_list: tasks), with the files written there (file_write or run_code {sandbox_id}). Limits: %s.", s.limits()),
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *runTaskIn) (*result, error) {
			return s.watchRefusals(ctx, in.SandboxID, func(ctx context.Context) (*result, error) {
				res, err := s.e.RunTask(ctx, *in)
				if err != nil {
					return nil, err
				}
				return s.execResult(res, "the full output is not kept: run the task's command with exec_command, redirected to a file"), nil
			})
		})

	addTool[packagesIn, execOut](s, "packages_install", "Install packages",
		joinLines(
			"Install packages into a sandbox with one of its language's package managers (languages_list: managers); returns the installer's outcome like exec_command.",
			"Prerequisite: a live sandbox_id. A sandbox without network can only install from local files in the sandbox (a wheel, a tarball, a vendor directory); a manager that needs the network fails with code unavailable.",
		),
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *packagesIn) (*result, error) {
			return s.watchRefusals(ctx, in.SandboxID, func(ctx context.Context) (*result, error) {
				res, err := s.e.PackagesInstall(ctx, *in)
				if err != nil {
					return nil, err
				}
				return s.execResult(res, "the full output is not kept"), nil
			})
		})

	addTool[runGetIn, runGetOut](s, "run_get", "Show a run record",
		"Show a run record: its metadata (language, steps, exit code, termination, duration, files), the start of its stdout and stderr logs and, for autofix runs, the attempts. Long logs are cut; the record's directory (dir) holds them whole.",
		annotations{readOnly: true, idempotent: true},
		s.runGet)

	addTool[runListIn, runListOut](s, "run_list", "List run records",
		"List run records (run_code and autofix runs), newest first: run id, language, start and end time, duration, exit code, success, sandbox. Filter by language and success. Use run_get for one run's output.",
		annotations{readOnly: true, idempotent: true},
		s.runList)
}

// runResult shapes run_code's outcome into the result budget, spending it
// once: the top level carries the run step's output (cut in the middle,
// pointing at the run record), the steps before it share a smaller part,
// and the last step, whose output the top level already is, carries none.
func (s *srv) runResult(res *apitypes.RunResult) *result {
	where := fmt.Sprintf("the run record keeps it: run_get {run_id: %q}, resource run://%s/stdout.log", res.RunID, res.RunID)
	return s.fit(func(limit int) *result {
		out := *res
		out.Steps = make([]apitypes.RunStep, len(res.Steps))
		cutAny := false
		earlier := 0
		if len(res.Steps) > 1 {
			earlier = limit / 4 / (len(res.Steps) - 1)
		}
		for i, st := range res.Steps {
			if i == len(res.Steps)-1 {
				st.Stdout, st.Stderr = "", ""
				out.Steps[i] = st
				break
			}
			lo, le := split(earlier, len(st.Stdout), len(st.Stderr))
			var c1, c2 bool
			st.Stdout, c1 = cut(st.Stdout, lo, where)
			st.Stderr, c2 = cut(st.Stderr, le, where)
			st.StdoutTruncated, st.StderrTruncated = st.StdoutTruncated || c1, st.StderrTruncated || c2
			cutAny = cutAny || c1 || c2
			out.Steps[i] = st
		}
		lo, le := split(limit-earlier*max(0, len(res.Steps)-1), len(res.Stdout), len(res.Stderr))
		var c1, c2 bool
		out.Stdout, c1 = cut(res.Stdout, lo, where)
		out.Stderr, c2 = cut(res.Stderr, le, where)
		out.StdoutTruncated, out.StderrTruncated = res.StdoutTruncated || c1, res.StderrTruncated || c2
		notes := []string{}
		if len(res.Steps) > 0 {
			notes = append(notes, "the last step's output is the top-level stdout/stderr")
		}
		if cutAny || c1 || c2 {
			notes = append(notes, "output cut to fit the result; "+where)
		}
		out.Note = strings.Join(notes, "; ")
		var head strings.Builder
		verdict := "succeeded"
		if !res.Success {
			verdict = "failed"
		}
		fmt.Fprintf(&head, "run %s (%s, sandbox %s) %s in %d ms\n", res.RunID, res.Language, res.SandboxID, verdict, res.DurationMS)
		for _, st := range res.Steps {
			fmt.Fprintf(&head, "  %s: %s\n", st.Name, termText(st.ExitCode, st.Termination, st.DurationMS))
		}
		if len(res.OutputFiles) > 0 {
			fmt.Fprintf(&head, "output files: %s\n", strings.Join(res.OutputFiles, ", "))
		}
		return &result{structured: out, text: summaryText(strings.TrimSuffix(head.String(), "\n"), int64(len(res.Stdout)), int64(len(res.Stderr)))}
	})
}

// runGet is run_get: a run record with its logs cut to fit the result.
func (s *srv) runGet(ctx context.Context, c *call, in *runGetIn) (*result, error) {
	rec, err := s.e.GetRun(ctx, in.RunID, int64(s.opt.MaxResultBytes))
	if err != nil {
		return nil, err
	}
	if rec.Attempts == nil {
		rec.Attempts = []apitypes.FixedAttempt{}
	}
	return s.fit(func(limit int) *result {
		out := *rec
		lo, le := split(limit, len(rec.Stdout), len(rec.Stderr))
		var c1, c2 bool
		out.Stdout, c1 = cut(rec.Stdout, lo, "whole log in "+filepath.Join(rec.Dir, "stdout.log"))
		out.Stderr, c2 = cut(rec.Stderr, le, "whole log in "+filepath.Join(rec.Dir, "stderr.log"))
		out.StdoutTruncated = rec.StdoutTruncated || c1
		out.StderrTruncated = rec.StderrTruncated || c2
		if c1 || c2 || rec.StdoutTruncated || rec.StderrTruncated {
			out.Note = "logs cut to fit the result; the whole logs are in " + rec.Dir
		}
		m := rec.Metadata
		head := fmt.Sprintf("run %s: %s, success %v, exit code %d (%s), %d ms, sandbox %s\nrecord: %s", m.RunID, m.Language, m.Success,
			m.ExitCode, m.Termination.Cause, m.DurationMS, m.SandboxID, rec.Dir)
		return &result{structured: out, text: summaryText(head, int64(len(rec.Stdout)), int64(len(rec.Stderr)))}
	}), nil
}

// runList is run_list: as many run records as the result holds.
func (s *srv) runList(ctx context.Context, c *call, in *runListIn) (*result, error) {
	list, err := s.e.ListRuns(ctx, engine.RunFilter{Limit: in.Limit, Language: in.Language, Success: in.Success})
	if err != nil {
		return nil, err
	}
	return s.fit(func(limit int) *result {
		out := runListOut{Runs: []apitypes.RunMetadata{}}
		var text strings.Builder
		size := 0
		for _, m := range list {
			size += 900 + 40*len(m.Files)
			if size > limit {
				out.Truncated = true
				break
			}
			out.Runs = append(out.Runs, m)
			fmt.Fprintf(&text, "%s %-8s success=%v exit=%d %dms %s\n", m.RunID, m.Language, m.Success, m.ExitCode, m.DurationMS, m.StartTime.Format("2006-01-02 15:04:05"))
		}
		if out.Truncated {
			fmt.Fprintf(&text, "[list cut at %d runs to fit the result; ask for a smaller limit]\n", len(out.Runs))
		}
		if len(list) == 0 {
			text.WriteString("no runs\n")
		}
		return &result{structured: out, text: text.String()}
	}), nil
}
