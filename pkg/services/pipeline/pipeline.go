package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// The run pipeline: a CodeRun is one run record in progress, bound to one
// sandbox (given, or ephemeral and terminated by Finish). Each Attempt runs the
// language's steps — install, compile, run — over a set of files in that
// sandbox and records them. RunCode makes one CodeRun with one attempt; the
// autofix loop makes one CodeRun and an attempt per fix.

// BackendVM is RunSpec.Backend for a run in a VM.
const BackendVM = "vm"

// networkNone is a sandbox without network (the engine's mode "none").
const networkNone = "none"

// RunSpec says which language a CodeRun runs, in which sandbox, and what its
// record says about it.
type RunSpec struct {
	Handler *lang.Handler
	// Kind is the record's kind: "run" (default) or "autofix".
	Kind string
	// SandboxID names a live sandbox of the handler's image to run in; empty
	// creates an ephemeral one from Sandbox, terminated by Finish.
	SandboxID string
	Sandbox   apitypes.CreateSandboxRequest
	// Backend of the ephemeral sandbox: "vm" runs it in a VM of the
	// language's guest image (Lifecycle.CreateRunVM); anything else is a
	// container.
	Backend string
	// Entrypoint and Args describe the program in metadata.json.
	Entrypoint string
	Args       []string
	// Deadline bounds every step of every attempt.
	Deadline time.Time
	// ReplayOf names the run this one replays (run_replay).
	ReplayOf string
}

// CodeRun is a run record being written and the sandbox it runs in.
type CodeRun struct {
	s         *Service
	h         *lang.Handler
	Record    *runs.Record
	Sandbox   *sandbox.Info
	Meta      runs.Metadata
	deadline  time.Time
	ephemeral bool
}

// Attempt is one pass of the pipeline over a set of files.
type Attempt struct {
	// Number is 0 for a plain run (its files go to code_snapshot/) and n ≥ 1
	// for the n-th attempt of a loop (code_snapshot/attempt_<n>/).
	Number int
	// Files are keyed by clean path relative to /workspace; Main is the
	// entrypoint among them.
	Files   map[string][]byte
	Main    string
	Args    []string
	Stdin   []byte
	Env     map[string]string
	Install bool // run the dependency managers whose manifests are present
	// MaxOutputBytes caps each stream in the result (0: the default).
	MaxOutputBytes int64
	// OnOutput, if not nil, receives every step's output as it arrives.
	OnOutput sandbox.OutputFunc
}

// StartRun creates a run record and binds it to a sandbox: the given one,
// which must be live and of the handler's image, or a new ephemeral one.
func (s *Service) StartRun(ctx context.Context, spec RunSpec) (*CodeRun, error) {
	ctx, span := telemetry.Start(ctx, "run.start", telemetry.Sandbox(spec.SandboxID))
	r, err := s.startRun(ctx, spec)
	if r != nil {
		span.SetAttributes(telemetry.Sandbox(r.Sandbox.ID))
	}
	return r, telemetry.End(span, err)
}

func (s *Service) startRun(ctx context.Context, spec RunSpec) (*CodeRun, error) {
	h := spec.Handler
	var given *sandbox.Info
	if spec.SandboxID != "" {
		if err := sandbox.CheckID(spec.SandboxID); err != nil {
			return nil, err
		}
		var err error
		if given, err = s.sandboxes.Get(ctx, spec.SandboxID); err != nil {
			return nil, err
		}
		if !(given.State == sandbox.StateReady || given.State == sandbox.StateRunning) {
			return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", given.ID, given.State)
		}
		// The image, or the language the sandbox was created for on
		// another image (the agent image runs python projects for the
		// agent autofix provider).
		if given.Image != h.Name && given.Language != h.Name {
			return nil, errdefs.Invalidf("sandbox_id: sandbox %s runs the %q image, not %q", given.ID, given.Image, h.Name)
		}
	}
	rec, err := s.NewRecord()
	if err != nil {
		return nil, err
	}
	r := &CodeRun{s: s, h: h, Record: rec, deadline: spec.Deadline, ephemeral: given == nil}
	r.Meta = runs.Metadata{Kind: spec.Kind, Language: h.Name, StartTime: rec.StartedAt.UTC(), Image: h.Name,
		Entrypoint: spec.Entrypoint, Args: spec.Args, Ephemeral: given == nil, Steps: []runs.Step{}, ReplayOf: spec.ReplayOf}
	r.Sandbox = given
	if given == nil {
		req := spec.Sandbox
		req.Language = h.Name
		labels := map[string]string{RunLabel: rec.ID}
		for k, v := range req.Labels {
			labels[k] = v
		}
		req.Labels = labels
		err = s.createEphemeral(ctx, func() (err error) {
			if spec.Backend == BackendVM {
				r.Sandbox, err = s.life.CreateRunVM(ctx, h.Name, req)
			} else {
				r.Sandbox, err = s.life.CreateSandbox(ctx, req)
			}
			return err
		})
		if err != nil {
			_ = r.Finish(context.WithoutCancel(ctx), nil, err)
			return nil, err
		}
	}
	r.Meta.SandboxID, r.Meta.ImageDigest = r.Sandbox.ID, r.Sandbox.ImageDigest
	if err := rec.WriteJSON(runs.ContainerInfoJSON, ContainerInfo(r.Sandbox, r.ephemeral)); err != nil {
		err = errdefs.Wrap(errdefs.Internal, err, "write container info")
		_ = r.Finish(context.WithoutCancel(ctx), nil, err)
		return nil, err
	}
	return r, nil
}

// Run runs one attempt: it snapshots and writes the files into /workspace,
// installs dependencies, compiles and runs, stopping at the first step that
// fails. The result's top level is the last step that ran. An error means
// the attempt could not be carried out (not that the program failed).
func (r *CodeRun) Run(ctx context.Context, a Attempt) (*RunResult, error) {
	sub := ""
	if a.Number > 0 {
		sub = "attempt_" + strconv.Itoa(a.Number)
		r.Meta.Attempts = a.Number
	}
	if err := r.Record.WriteSnapshot(sub, a.Files); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "write code snapshot")
	}
	names := make([]string, 0, len(a.Files))
	for n := range a.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	r.Meta.Files, r.Meta.Entrypoint = names, a.Main

	out := r.BuildDir()
	fctx, span := telemetry.Start(ctx, "run.write_files", telemetry.Sandbox(r.Sandbox.ID))
	if err := telemetry.End(span, r.writeFiles(fctx, a.Files, names, out)); err != nil {
		return nil, err
	}
	if !r.ephemeral {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = r.s.sandboxes.DeleteFile(dctx, r.Sandbox.ID, out, true)
		}()
	}
	vars := lang.Vars{File: a.Main, Files: r.h.Sources(names), Out: out, Args: a.Args}
	if vars.Args == nil {
		vars.Args = []string{}
	}
	res := &RunResult{RunID: r.Record.ID, SandboxID: r.Sandbox.ID, Language: r.h.Name, Steps: []RunStep{}}
	if a.Install {
		for _, d := range r.h.Installs(names) {
			env := map[string]string{}
			offline := r.Sandbox.Network == "" || r.Sandbox.Network == networkNone
			if offline {
				for k, v := range d.OfflineEnv {
					env[k] = v
				}
			}
			st, err := r.step(ctx, &a, res, StepInstall, lang.Expand(d.Install, vars), env, nil)
			if err != nil {
				return nil, err
			}
			if !StepOK(st) {
				if offline && lang.NeededNetwork(d, st.Stdout+st.Stderr) {
					r.Meta.Error = "dependencies need the network"
					return nil, errdefs.Unavailablef("install: %s could not install the dependencies in %s: they must be fetched over the network and sandbox %s has no network (network: none). Provide them as local files (a wheel directory, an npm tarball, a vendor directory) instead. (run %s)",
						d.Manager, d.Manifest, r.Sandbox.ID, r.Record.ID)
				}
				return res, nil
			}
		}
	}
	if r.h.Compiled() {
		st, err := r.step(ctx, &a, res, StepCompile, lang.Expand(r.h.Compile, vars), nil, nil)
		if err != nil {
			return nil, err
		}
		if !StepOK(st) {
			return res, nil
		}
	}
	if _, err := r.step(ctx, &a, res, StepRun, lang.Expand(r.h.Run, vars), nil, a.Stdin); err != nil {
		return nil, err
	}
	res.Success = true
	for _, st := range res.Steps {
		res.Success = res.Success && StepOK(&st)
	}
	res.OutputFiles = r.collectOutput(ctx)
	return res, nil
}

// Finish writes metadata.json from the last attempt's result (or the error
// that stopped the run), indexes the record and terminates an ephemeral
// sandbox. It counts the run in the metrics.
func (r *CodeRun) Finish(ctx context.Context, res *RunResult, runErr error) error {
	s := r.s
	if r.ephemeral && r.Sandbox != nil {
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := s.life.TerminateSandbox(tctx, r.Sandbox.ID); err != nil {
			s.log.Error("terminate ephemeral sandbox", "sandbox", r.Sandbox.ID, "run", r.Record.ID, "err", err)
		}
		cancel()
	}
	end := time.Now()
	r.Meta.EndTime = end.UTC()
	r.Meta.DurationMS = end.Sub(r.Record.StartedAt).Milliseconds()
	switch {
	case res != nil:
		res.DurationMS = r.Meta.DurationMS
		r.Meta.ExitCode, r.Meta.Success = res.ExitCode, res.Success
		r.Meta.Termination = recordTermination(res.Termination)
		r.Meta.OutputFiles = len(res.OutputFiles)
		if len(res.Steps) == 0 {
			r.Meta.ExitCode = -1
		}
	case runErr != nil:
		r.Meta.ExitCode = -1
		if n := len(r.Meta.Steps); n > 0 {
			r.Meta.ExitCode, r.Meta.Termination = r.Meta.Steps[n-1].ExitCode, r.Meta.Steps[n-1].Termination
		} else {
			r.Meta.Termination = runs.Termination{Cause: "error"}
		}
		if r.Meta.Error == "" {
			r.Meta.Error = errdefs.MessageOf(runErr)
		} else {
			r.Meta.Error += ": " + errdefs.MessageOf(runErr)
		}
	}
	outcome := "error"
	switch {
	case runErr == nil && res != nil && res.Success:
		outcome = "success"
	case runErr == nil:
		outcome = "failure"
	}
	s.metrics.Run(r.h.Name, outcome)
	return s.FinishRecord(ctx, r.Record, &r.Meta)
}

// StepOK reports whether a step exited 0.
func StepOK(st *RunStep) bool {
	return st.Termination.Cause == sandbox.CauseExited && st.ExitCode == 0
}

// writeFiles puts the files into /workspace and creates the build
// directory. Files go in sorted order, parents before children.
func (r *CodeRun) writeFiles(ctx context.Context, files map[string][]byte, names []string, out string) error {
	for _, name := range names {
		data := files[name]
		_, err := r.s.sandboxes.WriteFile(ctx, r.Sandbox.ID, agent.WriteFileRequest{
			Path: lang.Workspace + "/" + name, Mode: 0o644, Size: int64(len(data)), MkdirParents: true,
		}, bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("files: write %s: %w", name, err)
		}
	}
	if r.h.Compiled() {
		_, err := r.s.sandboxes.WriteFile(ctx, r.Sandbox.ID, agent.WriteFileRequest{
			Path: out + "/.keep", Mode: 0o644, MkdirParents: true,
		}, bytes.NewReader(nil))
		if err != nil {
			return fmt.Errorf("create build directory: %w", err)
		}
	}
	return nil
}

// Step runs one more step of attempt a (the autofix loop's test step) and
// records it in res and the metadata, as Run does its own.
func (r *CodeRun) Step(ctx context.Context, a *Attempt, res *RunResult, name string, argv []string) (*RunStep, error) {
	return r.step(ctx, a, res, name, argv, nil, nil)
}

// SetDeadline bounds the steps of the attempts that follow (each autofix
// attempt has its own).
func (r *CodeRun) SetDeadline(t time.Time) { r.deadline = t }

// Deadline is what bounds the steps.
func (r *CodeRun) Deadline() time.Time { return r.deadline }

// Language is the language (handler name) the run is recorded under.
func (r *CodeRun) Language() string { return r.h.Name }

// WriteFiles puts the files into /workspace (in sorted order, parents
// before children), as an attempt does, for steps run by the caller.
func (r *CodeRun) WriteFiles(ctx context.Context, files map[string][]byte, names []string) error {
	return r.writeFiles(ctx, files, names, "")
}

// RecordStep adds the outcome of a step the caller ran itself (a guest
// step through qemu-ga) to the result and the run record.
func (r *CodeRun) RecordStep(res *RunResult, name string, argv []string, er *sandbox.ExecResult) *RunStep {
	return r.recordStep(res, name, argv, er)
}

// RecordOutput is an OutputFunc that keeps a step's output in the run
// record and passes it on to a.OnOutput.
func (r *CodeRun) RecordOutput(a *Attempt) sandbox.OutputFunc { return r.recordOutput(a) }

// BuildDir is where this run's compile steps put what they build ({out}).
func (r *CodeRun) BuildDir() string { return buildRoot + "/" + r.Record.ID }

// Resume binds a reopened run record to a sandbox (nil: a loop ending
// without another attempt), with the metadata it had.
func (s *Service) Resume(rec *runs.Record, h *lang.Handler, meta runs.Metadata, sb *sandbox.Info) *CodeRun {
	return &CodeRun{s: s, h: h, Record: rec, Meta: meta, Sandbox: sb}
}

// step runs one step and records it in res and the metadata. A step the
// deadline leaves no time for is reported as timed out without running.
func (r *CodeRun) step(ctx context.Context, a *Attempt, res *RunResult, name string, argv []string, env map[string]string, stdin []byte) (*RunStep, error) {
	for k, v := range a.Env {
		if _, set := env[k]; !set {
			if env == nil {
				env = map[string]string{}
			}
			env[k] = v
		}
	}
	// One span per step; its argv and env stay out (code, secrets).
	ctx, span := telemetry.Start(ctx, "run.step "+name, telemetry.KeyStep.String(name), telemetry.Sandbox(r.Sandbox.ID))
	defer span.End()
	remaining := time.Until(r.deadline)
	var er *sandbox.ExecResult
	if remaining < 10*time.Millisecond {
		er = &sandbox.ExecResult{ExitCode: -1, Termination: sandbox.Termination{Cause: sandbox.CauseTimeout, Detail: "no time left for this step"}}
	} else {
		var err error
		er, err = r.s.sandboxes.Exec(ctx, r.Sandbox.ID, sandbox.ExecSpec{
			Argv: argv, Env: env, Cwd: lang.Workspace, Stdin: stdin, Timeout: remaining, MaxResultBytes: a.MaxOutputBytes,
		}, r.recordOutput(a))
		if err != nil {
			telemetry.SetOutcome(span, err)
			return nil, err
		}
		r.s.metrics.Exec(er)
	}
	telemetry.SetOutcome(span, nil)
	span.SetAttributes(telemetry.KeyExitCode.Int(er.ExitCode))
	return r.recordStep(res, name, argv, er), nil
}

// recordStep adds a step's outcome to the result and the run record.
func (r *CodeRun) recordStep(res *RunResult, name string, argv []string, er *sandbox.ExecResult) *RunStep {
	st := RunStep{Name: name, ExitCode: er.ExitCode, Stdout: er.Stdout, Stderr: er.Stderr,
		StdoutTruncated: er.StdoutTruncated, StderrTruncated: er.StderrTruncated,
		Termination: er.Termination, DurationMS: er.DurationMS, BlockedSyscalls: er.BlockedSyscalls}
	res.Steps = append(res.Steps, st)
	res.BlockedSyscalls = mergeBlocked(res.BlockedSyscalls, st.BlockedSyscalls)
	res.ExitCode, res.Stdout, res.Stderr = st.ExitCode, st.Stdout, st.Stderr
	res.StdoutTruncated, res.StderrTruncated, res.Termination = st.StdoutTruncated, st.StderrTruncated, st.Termination
	r.Meta.Steps = append(r.Meta.Steps, runs.Step{
		Name: name, Argv: argv, ExitCode: er.ExitCode, DurationMS: er.DurationMS, Termination: recordTermination(er.Termination),
		StdoutBytes: er.StdoutBytes, StderrBytes: er.StderrBytes,
		StdoutTruncated: er.StdoutTruncated, StderrTruncated: er.StderrTruncated,
		BlockedSyscalls: er.BlockedSyscalls,
	})
	r.Meta.StdoutBytes += er.StdoutBytes
	r.Meta.StderrBytes += er.StderrBytes
	return &res.Steps[len(res.Steps)-1]
}

// recordOutput is an OutputFunc that keeps a step's output in the run
// record and passes it on to a.OnOutput.
func (r *CodeRun) recordOutput(a *Attempt) sandbox.OutputFunc {
	return func(stream string, data []byte) {
		if stream == "stdout" {
			r.Record.Stdout.Write(data)
		} else {
			r.Record.Stderr.Write(data)
		}
		if a.OnOutput != nil {
			a.OnOutput(stream, data)
		}
	}
}

func recordTermination(t sandbox.Termination) runs.Termination {
	return runs.Termination(t) // same fields; metadata.json spells them in camelCase
}

// collectOutput copies /workspace/output into the record, up to
// maxRecordOutput bytes, and returns the paths it copied.
func (r *CodeRun) collectOutput(ctx context.Context) []string {
	dir := lang.Workspace + "/output"
	entries, err := r.s.sandboxes.ListFiles(ctx, r.Sandbox.ID, dir, true)
	if err != nil {
		r.s.log.Warn("list run output", "run", r.Record.ID, "err", err)
		return nil
	}
	var (
		names []string
		total int64
	)
	for _, fi := range entries {
		if fi.Type != agent.TypeFile {
			continue
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(fi.Path, dir), "/")
		dest, err := r.Record.OutputPath(rel)
		if err != nil || total+fi.Size > maxRecordOutput {
			continue
		}
		d, err := r.s.sandboxes.ReadFile(ctx, r.Sandbox.ID, fi.Path, 0, max(fi.Size, 1))
		if err != nil {
			continue
		}
		if err := r.Record.WriteFile(dest, d.Data); err != nil {
			continue
		}
		total += int64(len(d.Data))
		names = append(names, rel)
	}
	sort.Strings(names)
	return names
}

// ContainerInfo is container_info.json.
func ContainerInfo(sb *sandbox.Info, ephemeral bool) map[string]any {
	return map[string]any{
		"sandboxId": sb.ID, "image": sb.Image, "imageDigest": sb.ImageDigest, "language": sb.Language,
		"limits": sb.Limits, "cgroupPath": sb.CgroupPath, "network": sb.Network, "ephemeral": ephemeral,
		"createdAt": sb.CreatedAt,
	}
}

// Program validates what every way of running a program takes: the language,
// its files and entrypoint, arguments and stdin. It returns the language's
// handler, the files keyed by path relative to /workspace, and the entrypoint.
func (s *Service) Program(language, code string, files map[string]string, entrypoint string, args []string, stdin string) (*lang.Handler, map[string][]byte, string, error) {
	h, _, err := s.catalog.Handler("language", language)
	if err != nil {
		return nil, nil, "", err
	}
	out, main, err := RunFiles(h, code, files, entrypoint)
	if err != nil {
		return nil, nil, "", err
	}
	if err := apitypes.CheckArgs("args", args); err != nil {
		return nil, nil, "", err
	}
	if len(stdin) > apitypes.MaxStdin {
		return nil, nil, "", errdefs.Invalidf("stdin: %d bytes exceeds the maximum %d", len(stdin), apitypes.MaxStdin)
	}
	return h, out, main, nil
}

// WorkspaceRel turns a file path of a request (relative to /workspace, or
// absolute under it) into a clean relative path, or an error naming field.
func WorkspaceRel(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalidf("%s: empty path", field)
	case strings.ContainsRune(p, 0):
		return "", errdefs.Invalidf("%s: path contains a NUL byte", field)
	case len(p) > 1024:
		return "", errdefs.Invalidf("%s: path longer than 1024 bytes", field)
	}
	rel := p
	if path.IsAbs(p) {
		c := path.Clean(p)
		if !strings.HasPrefix(c, lang.Workspace+"/") {
			return "", errdefs.Invalidf("%s: path %q is outside %s", field, p, lang.Workspace)
		}
		rel = strings.TrimPrefix(c, lang.Workspace+"/")
	}
	if !filepath.IsLocal(rel) {
		return "", errdefs.Invalidf("%s: path %q is outside %s", field, p, lang.Workspace)
	}
	return path.Clean(rel), nil
}

// RunFiles validates and gathers the files of a request — code (written to
// the entrypoint, or a file named for the language), files, entrypoint —
// keyed by clean path relative to /workspace, and picks the entrypoint.
func RunFiles(h *lang.Handler, code string, files map[string]string, entrypoint string) (map[string][]byte, string, error) {
	if code == "" && len(files) == 0 {
		return nil, "", errdefs.Invalidf("code: required (or files)")
	}
	if len(files) > MaxRunFiles {
		return nil, "", errdefs.LimitExceededf("files: %d files exceed the maximum %d", len(files), MaxRunFiles)
	}
	out := make(map[string][]byte, len(files)+1)
	total := int64(len(code))
	for p, content := range files {
		rel, err := WorkspaceRel("files", p)
		if err != nil {
			return nil, "", err
		}
		if _, dup := out[rel]; dup {
			return nil, "", errdefs.Invalidf("files: %q is given twice", p)
		}
		total += int64(len(content))
		out[rel] = []byte(content)
	}
	if total > MaxRunFilesBytes {
		return nil, "", errdefs.LimitExceededf("files: %d bytes of code and files exceed the maximum %d", total, MaxRunFilesBytes)
	}
	// A file cannot also be a directory.
	for rel := range out {
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			if _, clash := out[d]; clash {
				return nil, "", errdefs.Invalidf("files: %q is both a file and a directory", d)
			}
		}
	}
	entry := ""
	if entrypoint != "" {
		rel, err := WorkspaceRel("entrypoint", entrypoint)
		if err != nil {
			return nil, "", err
		}
		entry = rel
	}
	if code != "" {
		name := entry
		if name == "" {
			name = h.FileNameFor(code)
		}
		if _, dup := out[name]; dup {
			return nil, "", errdefs.Invalidf("code: files also has %q, the file code would be written to", name)
		}
		out[name] = []byte(code)
		entry = name
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	main, err := h.MainFile(names, entry)
	if err != nil {
		return nil, "", errdefs.Invalidf("entrypoint: %v", err)
	}
	return out, main, nil
}

// mergeBlocked adds the counts of b to a, by syscall name.
func mergeBlocked(a, b []apitypes.BlockedSyscall) []apitypes.BlockedSyscall {
	for _, x := range b {
		i := slices.IndexFunc(a, func(y apitypes.BlockedSyscall) bool { return y.Name == x.Name })
		if i < 0 {
			a = append(a, x)
		} else {
			a[i].Count += x.Count
		}
	}
	return a
}
