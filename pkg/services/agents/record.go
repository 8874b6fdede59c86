package agents

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
)

// agentRecord is the run record (kind "agent") of one agent session:
//
//	code_snapshot/     the files the session started from
//	transcript.jsonl   Claude Code's stream-json output, every line
//	stdout.log         the progress lines (AgentProgress.String)
//	stderr.log         the CLI's stderr
//	agent_result.json  the AgentRunResult
//	metadata.json      kind agent, the sandbox, success, termination (its
//	                   detail: the result's cause), one step "agent"
//
// The transcript is not under the log cap: it is the session itself, and
// run retention (runs.max_age, runs.max_total_size) bounds it like any
// record.
type agentRecord struct {
	*runs.Record
	records        Records
	Meta           runs.Metadata
	transcript     *os.File
	transcriptPath string
	argv           []string
}

// startRecord creates the record of a session in sandbox id that
// starts from files.
func (s *Service) startRecord(ctx context.Context, id string, files map[string]string, ephemeral bool) (*agentRecord, error) {
	info, err := s.o.Sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	rec, err := s.o.Records.New()
	if err != nil {
		return nil, err
	}
	r := &agentRecord{Record: rec, records: s.o.Records, transcriptPath: filepath.Join(rec.Dir, runs.TranscriptJSONL)}
	names := make([]string, 0, len(files))
	snapshot := make(map[string][]byte, len(files))
	for p, c := range files {
		p = filepath.ToSlash(filepath.Clean(p))
		names = append(names, p)
		snapshot[p] = []byte(c)
	}
	sort.Strings(names)
	r.Meta = runs.Metadata{Kind: "agent", Language: info.Language, Image: info.Image, ImageDigest: info.ImageDigest,
		SandboxID: id, StartTime: rec.StartedAt.UTC(), Ephemeral: ephemeral, Files: names, Steps: []runs.Step{}}
	err = errors.Join(rec.WriteSnapshot("", snapshot), rec.WriteJSON(runs.ContainerInfoJSON, s.o.Records.ContainerInfo(info, ephemeral)))
	if err == nil {
		r.transcript, err = os.OpenFile(r.transcriptPath, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	}
	if err != nil {
		err = errdefs.Wrap(errdefs.Internal, err, "write run record")
		return nil, r.finish(ctx, nil, err)
	}
	return r, nil
}

// logProgress adds an event to stdout.log.
func (r *agentRecord) logProgress(p AgentProgress) {
	_, _ = r.Stdout.Write([]byte(strings.TrimRight(p.String(), "\n") + "\n"))
}

// finish writes the result and metadata.json and indexes the record; it
// returns runErr, or the error writing the record.
func (r *agentRecord) finish(ctx context.Context, res *AgentRunResult, runErr error) error {
	ctx = context.WithoutCancel(ctx)
	if r.transcript != nil {
		_ = r.transcript.Close()
	}
	end := time.Now()
	m := &r.Meta
	m.EndTime, m.DurationMS = end.UTC(), end.Sub(r.StartedAt).Milliseconds()
	var errs []error
	if res != nil {
		m.ExitCode, m.Success = res.ExitCode, res.Success
		m.Termination.Detail = res.Cause
		m.Steps = append(m.Steps, runs.Step{Name: "agent", Argv: r.argv, ExitCode: res.ExitCode, DurationMS: m.DurationMS, Termination: m.Termination,
			StdoutBytes: r.Stdout.Total(), StderrBytes: r.Stderr.Total()})
		m.StdoutBytes, m.StderrBytes = r.Stdout.Total(), r.Stderr.Total()
		errs = append(errs, r.WriteJSON(runs.AgentResultJSON, res))
	} else {
		m.ExitCode = -1
		if m.Termination.Cause == "" {
			m.Termination.Cause = "error"
		}
		m.Error = errdefs.MessageOf(runErr)
	}
	errs = append(errs, r.records.Finish(ctx, r.Record, m))
	if runErr != nil {
		return runErr
	}
	if err := errors.Join(errs...); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "write run record %s", r.ID)
	}
	return nil
}
