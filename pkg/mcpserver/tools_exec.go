package mcpserver

import (
	"context"
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// execIn is the contract's exec request and MCP's background switch.
type execIn struct {
	apitypes.ExecRequest
	Background bool `json:"background,omitempty" jsonschema_description:"Start the command and return its job_id at once; follow it with job_status. Use for anything that may outlast your tool-call timeout (builds, test suites, servers)."`
}

// execOut is the outcome of a command (exec_command, run_task,
// packages_install); with background only job_id and state are set.
type execOut = apitypes.CommandResult

type jobStatusIn struct {
	SandboxID    string `json:"sandbox_id" jsonschema_description:"Id of the sandbox the job runs in."`
	JobID        string `json:"job_id" jsonschema_description:"Job id from exec_command with background: true."`
	StdoutOffset int64  `json:"stdout_offset,omitempty" jsonschema_description:"Byte offset in stdout to read from: 0 first, then next_stdout_offset of the previous answer."`
	StderrOffset int64  `json:"stderr_offset,omitempty" jsonschema_description:"Byte offset in stderr to read from: 0 first, then next_stderr_offset of the previous answer."`
}

type jobStatusOut = apitypes.JobStatus

type jobKillIn = apitypes.JobKillRequest

type jobKillOut = apitypes.JobKillResult

func (s *srv) addExecTools() {
	addTool[execIn, execOut](s, "exec_command", "Run a command in a sandbox",
		joinLines(
			"Run a command in a sandbox and wait for it: exit_code, stdout, stderr, duration and how it ended (termination.cause: exited, timeout, oom, output_limit, signal, killed).",
			"Prerequisite: a live sandbox_id from sandbox_create. The command runs in /workspace as an unprivileged user; no network unless the sandbox has it.",
			fmt.Sprintf("Limits: %s; output over %s per stream is dropped (stdout_truncated). Output longer than this tool's result size is cut in the middle with a marker (redirect to a file and use file_read for all of it).", s.limits(), s.cfg.Sandbox.OutputLimit),
			"With a progress token, output is sent as progress notifications while the command runs. With background: true the call returns a job_id at once: poll job_status with the offsets it returns until state is finished, job_kill to stop it.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *execIn) (*result, error) {
			req := in.ExecRequest
			if in.Background {
				id, err := s.e.StartJob(ctx, req)
				if err != nil {
					return nil, err
				}
				out := execOut{JobID: id, State: apitypes.JobRunning}
				return &result{structured: out, text: fmt.Sprintf("started job %s in sandbox %s; poll job_status {sandbox_id: %q, job_id: %q, stdout_offset: 0, stderr_offset: 0}", id, in.SandboxID, in.SandboxID, id)}, nil
			}
			return s.watchRefusals(ctx, req.SandboxID, func(ctx context.Context) (*result, error) {
				res, err := s.e.Exec(ctx, req, c.progress.outputFunc())
				if err != nil {
					return nil, err
				}
				return s.execResult(res, "the full output is not kept: redirect it to a file in the sandbox and read that with file_read, or use background: true and page it with job_status"), nil
			})
		})

	addTool[jobStatusIn, jobStatusOut](s, "job_status", "Follow a background job",
		joinLines(
			"Check on a background job: its state (running or finished) and the output it wrote since the given offsets, with the offsets to pass next time; once finished, its exit_code and termination.",
			"Prerequisite: a job_id from exec_command with background: true. Start at offsets 0 and pass next_stdout_offset/next_stderr_offset back; when more is true, call again at once, else wait a few seconds between calls while it runs. Each answer carries a bounded page of output.",
		),
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *jobStatusIn) (*result, error) {
			page := s.opt.MaxResultBytes / 5
			for {
				st, err := s.e.JobStatus(ctx, engine.JobStatusRequest{SandboxID: in.SandboxID, JobID: in.JobID,
					StdoutOffset: in.StdoutOffset, StderrOffset: in.StderrOffset, MaxBytes: page})
				if err != nil {
					return nil, err
				}
				// The engine pages the output: never a UTF-8 sequence
				// split between two pages, more when a page was full.
				r := &result{structured: *st, text: jobText(st)}
				if resultSize(r) <= s.opt.MaxResultBytes || page <= 512 {
					return r, nil
				}
				page /= 2
			}
		})

	addTool[jobKillIn, jobKillOut](s, "job_kill", "Stop a background job",
		"Send a signal (default SIGKILL) to a background job's whole process group and report its state. Prerequisite: a job_id from exec_command with background: true. Its output stays readable with job_status.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *jobKillIn) (*result, error) {
			res, err := s.e.KillJob(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: *res, text: fmt.Sprintf("sent %s to job %s: %s", res.Signal, res.JobID, res.State)}, nil
		})
}

// execResult shapes a command's outcome into the result budget; where says
// where the full output is when it had to be cut.
func (s *srv) execResult(res *apitypes.ExecResult, where string) *result {
	return s.fit(func(limit int) *result {
		lo, le := split(limit, len(res.Stdout), len(res.Stderr))
		stdout, cutOut := cut(res.Stdout, lo, where)
		stderr, cutErr := cut(res.Stderr, le, where)
		out := apitypes.FinishedCommand(res)
		out.Stdout, out.Stderr = stdout, stderr
		out.StdoutTruncated, out.StderrTruncated = res.StdoutTruncated || cutOut, res.StderrTruncated || cutErr
		if cutOut || cutErr {
			out.Note = "output cut to fit the result; " + where
		}
		return &result{structured: out, text: summaryText(termText(res.ExitCode, res.Termination, res.DurationMS), res.StdoutBytes, res.StderrBytes)}
	})
}

func termText(code int, t apitypes.Termination, ms int64) string {
	s := fmt.Sprintf("exit code %d (%s", code, t.Cause)
	if t.Signal != "" {
		s += " " + t.Signal
	}
	if t.Detail != "" {
		s += ": " + t.Detail
	}
	return s + fmt.Sprintf(") in %d ms", ms)
}

// summaryText is a result's summary, never the output: the output is in
// the structured content and in its JSON text block (toolResult), and a
// client hands its model one or the other; repeating it in the summary
// would spend the result budget twice (docs/mcp.md).
func summaryText(head string, stdoutBytes, stderrBytes int64) string {
	return fmt.Sprintf("%s\nstdout %d bytes, stderr %d bytes (the output is in the JSON below)", head, stdoutBytes, stderrBytes)
}

func jobText(st *jobStatusOut) string {
	head := fmt.Sprintf("job %s: %s", st.JobID, st.State)
	if st.ExitCode != nil && st.Termination != nil {
		head += "; " + termText(*st.ExitCode, *st.Termination, st.DurationMS)
	}
	head += fmt.Sprintf("\nnext offsets: stdout_offset %d, stderr_offset %d", st.NextStdoutOffset, st.NextStderrOffset)
	if st.More {
		head += " (more output is waiting)"
	}
	return summaryText(head, int64(len(st.Stdout)), int64(len(st.Stderr)))
}
