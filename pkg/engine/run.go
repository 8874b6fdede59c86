package engine

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Limits of run_code's input.
const (
	// MaxRunFiles is how many files one run may carry.
	MaxRunFiles = 1000
	// MaxRunFilesBytes caps the files' (and code's) total size.
	MaxRunFilesBytes = 32 << 20
	// maxRunArgs caps the program's arguments.
	maxRunArgs = 1024
	// maxRecordOutput caps what a record keeps of /workspace/output.
	maxRecordOutput = 64 << 20
)

// Run step names.
const (
	StepInstall = "install"
	StepCompile = "compile"
	StepRun     = "run"
)

// buildRoot is where compile steps put what they build ({out}), one
// directory per run.
const buildRoot = "/tmp/.sandboxd-build"

// runState is the engine's run records store, opened once (Engine embeds
// it).
type runState struct {
	runsOnce sync.Once
	runs     *runs.Store
	runsErr  error
}

// initRuns opens the run records store. engine.New calls it; RunCode and
// friends also call it lazily, so that it happens once either way.
func (e *Engine) initRuns() error {
	e.runsOnce.Do(func() {
		rc := e.cfg.Runs
		dir := rc.Dir
		if dir == "" {
			dir = filepath.Join(e.cfg.Paths.StateDir, "runs")
		}
		e.runs, e.runsErr = runs.Open(dir, e.store, runs.Options{
			LogCap: int64(rc.LogCap), MaxAge: rc.MaxAge.D(), MaxTotalSize: int64(rc.MaxTotalSize),
		})
		if e.runsErr != nil {
			e.runsErr = fmt.Errorf("open run records: %w", e.runsErr)
			return
		}
		if n, err := e.runs.Prune(context.Background()); err != nil {
			e.log.Warn("run records retention", "err", err)
		} else if n > 0 {
			e.log.Info("run records retention", "deleted", n)
		}
	})
	return e.runsErr
}

func (e *Engine) runStore() (*runs.Store, error) {
	if err := e.initRuns(); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "run records")
	}
	return e.runs, nil
}

// RunCodeRequest is the input of run_code.
type RunCodeRequest = apitypes.RunCodeRequest

// RunStep is the outcome of one step of a run.
type RunStep = apitypes.RunStep

// RunResult is the outcome of run_code: the steps, and at the top level the
// last step that ran (the run step, or the one that failed).
type RunResult = apitypes.RunResult

// handler returns the language handler of an enabled language.
func (e *Engine) handler(field, name string) (*lang.Handler, *image.Recipe, error) {
	if name == "" {
		return nil, nil, errdefs.Invalidf("%s: required (one of %s)", field, strings.Join(e.languageNames(), ", "))
	}
	r, ok := e.recipes[name]
	if ok && len(e.cfg.Images.Languages) > 0 && !slices.Contains(e.cfg.Images.Languages, name) {
		ok = false
	}
	if !ok {
		return nil, nil, errdefs.Invalidf("%s: unknown language %q (known: %s)", field, name, strings.Join(e.languageNames(), ", "))
	}
	h, err := lang.New(r)
	if err != nil {
		return nil, nil, errdefs.Invalidf("%s: %q is an image, not a language: %v", field, name, err)
	}
	return h, r, nil
}

// languageNames lists the enabled recipes that are languages.
func (e *Engine) languageNames() []string {
	var out []string
	for name, r := range e.recipes {
		if len(e.cfg.Images.Languages) > 0 && !slices.Contains(e.cfg.Images.Languages, name) {
			continue
		}
		if _, err := lang.New(r); err == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// workspaceRel turns a file path of a request (relative to /workspace, or
// absolute under it) into a clean relative path, or an error naming field.
func workspaceRel(field, p string) (string, error) {
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

// runFiles validates and gathers a request's files, keyed by clean path
// relative to /workspace, and picks the entrypoint.
func runFiles(h *lang.Handler, req *RunCodeRequest) (map[string][]byte, string, error) {
	if req.Code == "" && len(req.Files) == 0 {
		return nil, "", errdefs.Invalidf("code: required (or files)")
	}
	if len(req.Files) > MaxRunFiles {
		return nil, "", errdefs.LimitExceededf("files: %d files exceed the maximum %d", len(req.Files), MaxRunFiles)
	}
	files := make(map[string][]byte, len(req.Files)+1)
	total := int64(len(req.Code))
	for p, content := range req.Files {
		rel, err := workspaceRel("files", p)
		if err != nil {
			return nil, "", err
		}
		if _, dup := files[rel]; dup {
			return nil, "", errdefs.Invalidf("files: %q is given twice", p)
		}
		total += int64(len(content))
		files[rel] = []byte(content)
	}
	if total > MaxRunFilesBytes {
		return nil, "", errdefs.LimitExceededf("files: %d bytes of code and files exceed the maximum %d", total, MaxRunFilesBytes)
	}
	// A file cannot also be a directory.
	for rel := range files {
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			if _, clash := files[d]; clash {
				return nil, "", errdefs.Invalidf("files: %q is both a file and a directory", d)
			}
		}
	}
	entry := ""
	if req.Entrypoint != "" {
		rel, err := workspaceRel("entrypoint", req.Entrypoint)
		if err != nil {
			return nil, "", err
		}
		entry = rel
	}
	if req.Code != "" {
		name := entry
		if name == "" {
			name = h.FileNameFor(req.Code)
		}
		if _, dup := files[name]; dup {
			return nil, "", errdefs.Invalidf("code: files also has %q, the file code would be written to", name)
		}
		files[name] = []byte(req.Code)
		entry = name
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	main, err := h.MainFile(names, entry)
	if err != nil {
		return nil, "", errdefs.Invalidf("entrypoint: %v", err)
	}
	return files, main, nil
}

// runBudget is the run's total time limit.
func (e *Engine) runBudget(field string, secs *float64) (time.Duration, error) {
	sc := e.cfg.Sandbox
	if secs == nil {
		return sc.ExecTimeout.D(), nil
	}
	t := *secs
	if !(t > 0) || t > 1e9 {
		return 0, errdefs.Invalidf("%s: must be positive, got %v", field, t)
	}
	d := time.Duration(t * float64(time.Second))
	if max := sc.MaxExecTimeout.D(); max > 0 && d > max {
		return 0, errdefs.Invalidf("%s: %v exceeds the maximum %s", field, t, max)
	}
	return d, nil
}

// RunCode runs source code: it writes the files into a sandbox (the given
// one, or an ephemeral one terminated afterwards), installs dependencies,
// compiles and runs, keeps a run record, and returns the steps' outcomes.
// onOutput, if not nil, receives every step's output as it arrives.
func (e *Engine) RunCode(ctx context.Context, req RunCodeRequest, onOutput sandbox.OutputFunc) (*RunResult, error) {
	h, _, err := e.handler("language", req.Language)
	if err != nil {
		return nil, err
	}
	files, main, err := runFiles(h, &req)
	if err != nil {
		return nil, err
	}
	if len(req.Args) > maxRunArgs {
		return nil, errdefs.Invalidf("args: %d arguments exceed the maximum %d", len(req.Args), maxRunArgs)
	}
	for i, a := range req.Args {
		if strings.ContainsRune(a, 0) {
			return nil, errdefs.Invalidf("args[%d]: contains a NUL byte", i)
		}
	}
	if len(req.Stdin) > maxStdin {
		return nil, errdefs.Invalidf("stdin: %d bytes exceeds the maximum %d", len(req.Stdin), maxStdin)
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	budget, err := e.runBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	switch req.Network {
	case "", "none":
	case "egress", "allowlist":
		return nil, errdefs.Unavailablef("network: mode %q is not available yet; only \"none\"", req.Network)
	default:
		return nil, errdefs.Invalidf("network: must be none, egress or allowlist, got %q", req.Network)
	}
	var given *sandbox.Info
	if req.SandboxID != "" {
		if err := checkSandboxID(req.SandboxID); err != nil {
			return nil, err
		}
		if given, err = e.sandboxes.Get(ctx, req.SandboxID); err != nil {
			return nil, err
		}
		if !(given.State == sandbox.StateReady || given.State == sandbox.StateRunning) {
			return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", given.ID, given.State)
		}
		if given.Image != h.Name {
			return nil, errdefs.Invalidf("sandbox_id: sandbox %s runs the %q image, not %q", given.ID, given.Image, h.Name)
		}
	}
	rs, err := e.runStore()
	if err != nil {
		return nil, err
	}

	rec, err := rs.Create()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create run record")
	}
	r := &codeRun{e: e, h: h, req: &req, rec: rec, files: files, main: main, onOutput: onOutput,
		deadline: time.Now().Add(budget)}
	r.meta = runs.Metadata{Language: h.Name, StartTime: rec.StartedAt.UTC(), Image: h.Name, Entrypoint: main,
		Args: req.Args, Ephemeral: given == nil, Steps: []runs.Step{}}
	for n := range files {
		r.meta.Files = append(r.meta.Files, n)
	}
	sort.Strings(r.meta.Files)
	res, runErr := r.run(ctx, given)
	if err := r.finish(context.WithoutCancel(ctx), res, runErr); err != nil && runErr == nil {
		e.log.Error("write run record", "run", rec.ID, "err", err)
	}
	outcome := "error"
	switch {
	case runErr == nil && res.Success:
		outcome = "success"
	case runErr == nil:
		outcome = "failure"
	}
	e.metrics.runs.WithLabelValues(h.Name, outcome).Inc()
	if runErr != nil {
		return nil, runErr
	}
	return res, nil
}

// codeRun is one RunCode call in progress.
type codeRun struct {
	e        *Engine
	h        *lang.Handler
	req      *RunCodeRequest
	rec      *runs.Record
	files    map[string][]byte
	main     string
	onOutput sandbox.OutputFunc
	deadline time.Time

	sb   *sandbox.Info
	meta runs.Metadata
}

func (r *codeRun) run(ctx context.Context, given *sandbox.Info) (*RunResult, error) {
	e := r.e
	if err := r.rec.WriteSnapshot("", r.files); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "write code snapshot")
	}
	if given != nil {
		r.sb = given
	} else {
		info, err := e.CreateSandbox(ctx, CreateSandboxRequest{
			Language: r.h.Name, Network: r.req.Network, MemoryMB: r.req.MemoryMB, DiskMB: r.req.DiskMB,
			Labels: map[string]string{"sandboxd.run": r.rec.ID},
		})
		if err != nil {
			return nil, err
		}
		r.sb = info
		defer func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if _, err := e.TerminateSandbox(tctx, info.ID); err != nil {
				e.log.Error("terminate ephemeral sandbox", "sandbox", info.ID, "run", r.rec.ID, "err", err)
			}
		}()
	}
	r.meta.SandboxID, r.meta.ImageDigest = r.sb.ID, r.sb.ImageDigest
	if err := r.rec.WriteJSON(runs.ContainerInfoJSON, containerInfo(r.sb, given == nil)); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "write container info")
	}

	out := buildRoot + "/" + r.rec.ID
	if err := r.writeFiles(ctx, out); err != nil {
		return nil, err
	}
	if given != nil {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = e.sandboxes.DeleteFile(dctx, r.sb.ID, out, true)
		}()
	}
	names := r.meta.Files
	vars := lang.Vars{File: r.main, Files: r.h.Sources(names), Out: out, Args: r.req.Args}
	if vars.Args == nil {
		vars.Args = []string{}
	}
	res := &RunResult{RunID: r.rec.ID, SandboxID: r.sb.ID, Language: r.h.Name, Steps: []RunStep{}}

	install := r.req.Install == nil || *r.req.Install
	if install {
		for _, d := range r.h.Installs(names) {
			env := map[string]string{}
			offline := r.sb.Network == "" || r.sb.Network == "none"
			if offline {
				for k, v := range d.OfflineEnv {
					env[k] = v
				}
			}
			st, err := r.step(ctx, res, StepInstall, lang.Expand(d.Install, vars), env, nil)
			if err != nil {
				return nil, err
			}
			if !stepOK(st) {
				if offline && lang.NeededNetwork(d, st.Stdout+st.Stderr) {
					r.meta.Error = "dependencies need the network"
					return nil, errdefs.Unavailablef("install: %s could not install the dependencies in %s: they must be fetched over the network and sandbox %s has no network (network: none). Provide them as local files (a wheel directory, an npm tarball, a vendor directory) instead. (run %s)",
						d.Manager, d.Manifest, r.sb.ID, r.rec.ID)
				}
				return res, nil
			}
		}
	}
	if r.h.Compiled() {
		st, err := r.step(ctx, res, StepCompile, lang.Expand(r.h.Compile, vars), nil, nil)
		if err != nil {
			return nil, err
		}
		if !stepOK(st) {
			return res, nil
		}
	}
	var stdin []byte
	if r.req.Stdin != "" {
		stdin = []byte(r.req.Stdin)
	}
	if _, err := r.step(ctx, res, StepRun, lang.Expand(r.h.Run, vars), nil, stdin); err != nil {
		return nil, err
	}
	res.Success = true
	for _, st := range res.Steps {
		res.Success = res.Success && stepOK(&st)
	}
	res.OutputFiles = r.collectOutput(ctx)
	return res, nil
}

func stepOK(st *RunStep) bool {
	return st.Termination.Cause == sandbox.CauseExited && st.ExitCode == 0
}

// writeFiles puts the files into /workspace and creates the build
// directory. Files go in sorted order, parents before children.
func (r *codeRun) writeFiles(ctx context.Context, out string) error {
	for _, name := range r.meta.Files {
		data := r.files[name]
		_, err := r.e.sandboxes.WriteFile(ctx, r.sb.ID, agent.WriteFileRequest{
			Path: lang.Workspace + "/" + name, Mode: 0o644, Size: int64(len(data)), MkdirParents: true,
		}, bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("files: write %s: %w", name, err)
		}
	}
	if r.h.Compiled() {
		_, err := r.e.sandboxes.WriteFile(ctx, r.sb.ID, agent.WriteFileRequest{
			Path: out + "/.keep", Mode: 0o644, MkdirParents: true,
		}, bytes.NewReader(nil))
		if err != nil {
			return fmt.Errorf("create build directory: %w", err)
		}
	}
	return nil
}

// step runs one step and records it in res and the metadata. A step the
// deadline leaves no time for is reported as timed out without running.
func (r *codeRun) step(ctx context.Context, res *RunResult, name string, argv []string, env map[string]string, stdin []byte) (*RunStep, error) {
	for k, v := range r.req.Env {
		if _, set := env[k]; !set {
			if env == nil {
				env = map[string]string{}
			}
			env[k] = v
		}
	}
	remaining := time.Until(r.deadline)
	var er *sandbox.ExecResult
	if remaining < 10*time.Millisecond {
		er = &sandbox.ExecResult{ExitCode: -1, Termination: sandbox.Termination{Cause: sandbox.CauseTimeout, Detail: "no time left for this step"}}
	} else {
		var err error
		er, err = r.e.sandboxes.Exec(ctx, r.sb.ID, sandbox.ExecSpec{
			Argv: argv, Env: env, Cwd: lang.Workspace, Stdin: stdin, Timeout: remaining, MaxResultBytes: r.req.MaxOutputBytes,
		}, func(stream string, data []byte) {
			if stream == "stdout" {
				r.rec.Stdout.Write(data)
			} else {
				r.rec.Stderr.Write(data)
			}
			if r.onOutput != nil {
				r.onOutput(stream, data)
			}
		})
		if err != nil {
			return nil, err
		}
		r.e.metrics.execTime.Observe(float64(er.DurationMS) / 1000)
		r.e.metrics.causes.WithLabelValues(er.Termination.Cause).Inc()
	}
	st := RunStep{Name: name, ExitCode: er.ExitCode, Stdout: er.Stdout, Stderr: er.Stderr,
		StdoutTruncated: er.StdoutTruncated, StderrTruncated: er.StderrTruncated,
		Termination: er.Termination, DurationMS: er.DurationMS}
	res.Steps = append(res.Steps, st)
	res.ExitCode, res.Stdout, res.Stderr = st.ExitCode, st.Stdout, st.Stderr
	res.StdoutTruncated, res.StderrTruncated, res.Termination = st.StdoutTruncated, st.StderrTruncated, st.Termination
	r.meta.Steps = append(r.meta.Steps, runs.Step{
		Name: name, Argv: argv, ExitCode: er.ExitCode, DurationMS: er.DurationMS, Termination: recordTermination(er.Termination),
		StdoutBytes: er.StdoutBytes, StderrBytes: er.StderrBytes,
		StdoutTruncated: er.StdoutTruncated, StderrTruncated: er.StderrTruncated,
	})
	r.meta.StdoutBytes += er.StdoutBytes
	r.meta.StderrBytes += er.StderrBytes
	return &res.Steps[len(res.Steps)-1], nil
}

func recordTermination(t sandbox.Termination) runs.Termination {
	return runs.Termination(t) // same fields; metadata.json spells them in camelCase
}

// collectOutput copies /workspace/output into the record, up to
// maxRecordOutput bytes, and returns the paths it copied.
func (r *codeRun) collectOutput(ctx context.Context) []string {
	dir := lang.Workspace + "/output"
	entries, err := r.e.sandboxes.ListFiles(ctx, r.sb.ID, dir, true)
	if err != nil {
		r.e.log.Warn("list run output", "run", r.rec.ID, "err", err)
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
		dest, err := r.rec.OutputPath(rel)
		if err != nil || total+fi.Size > maxRecordOutput {
			continue
		}
		d, err := r.e.sandboxes.ReadFile(ctx, r.sb.ID, fi.Path, 0, max(fi.Size, 1))
		if err != nil {
			continue
		}
		if err := r.rec.WriteFile(dest, d.Data); err != nil {
			continue
		}
		total += int64(len(d.Data))
		names = append(names, rel)
	}
	sort.Strings(names)
	return names
}

// finish writes metadata.json and indexes the record.
func (r *codeRun) finish(ctx context.Context, res *RunResult, runErr error) error {
	end := time.Now()
	r.meta.EndTime = end.UTC()
	r.meta.DurationMS = end.Sub(r.rec.StartedAt).Milliseconds()
	switch {
	case res != nil:
		res.DurationMS = r.meta.DurationMS
		r.meta.ExitCode, r.meta.Success = res.ExitCode, res.Success
		r.meta.Termination = recordTermination(res.Termination)
		r.meta.OutputFiles = len(res.OutputFiles)
		if len(res.Steps) == 0 {
			r.meta.ExitCode = -1
		}
	case runErr != nil:
		r.meta.ExitCode = -1
		if n := len(r.meta.Steps); n > 0 {
			r.meta.ExitCode, r.meta.Termination = r.meta.Steps[n-1].ExitCode, r.meta.Steps[n-1].Termination
		} else {
			r.meta.Termination = runs.Termination{Cause: "error"}
		}
		if r.meta.Error == "" {
			r.meta.Error = errdefs.MessageOf(runErr)
		} else {
			r.meta.Error += ": " + errdefs.MessageOf(runErr)
		}
	}
	return r.e.runs.Finish(ctx, r.rec, &r.meta)
}

// containerInfo is container_info.json.
func containerInfo(sb *sandbox.Info, ephemeral bool) map[string]any {
	return map[string]any{
		"sandboxId": sb.ID, "image": sb.Image, "imageDigest": sb.ImageDigest, "language": sb.Language,
		"limits": sb.Limits, "cgroupPath": sb.CgroupPath, "network": sb.Network, "ephemeral": ephemeral,
		"createdAt": sb.CreatedAt,
	}
}

// RunTaskRequest is the input of run_task.
type RunTaskRequest struct {
	SandboxID string `json:"sandbox_id"`
	Task      string `json:"task"` // lint | build | test
	// Path is the task's target, relative to /workspace or absolute under
	// it (default: /workspace itself).
	Path           string            `json:"path,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty"`
	MaxOutputBytes int64             `json:"-"`
}

// sandboxHandler returns a live sandbox and its language's handler.
func (e *Engine) sandboxHandler(ctx context.Context, id string) (*sandbox.Info, *lang.Handler, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, nil, err
	}
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if !(info.State == sandbox.StateReady || info.State == sandbox.StateRunning) {
		return nil, nil, errdefs.Conflictf("sandbox %s is %s", info.ID, info.State)
	}
	r, ok := e.recipes[info.Image]
	if !ok {
		return nil, nil, errdefs.Invalidf("sandbox_id: sandbox %s runs image %q, which has no recipe", info.ID, info.Image)
	}
	h, err := lang.New(r)
	if err != nil {
		return nil, nil, errdefs.Invalidf("sandbox_id: sandbox %s runs image %q, which is not a language", info.ID, info.Image)
	}
	return info, h, nil
}

// skipDirs are not searched for sources ({files}) by tasks.
var skipDirs = []string{".venv", "node_modules", "target", ".git", "output", "__pycache__", "build", "dist"}

// RunTask runs the sandbox language's lint, build or test command.
func (e *Engine) RunTask(ctx context.Context, req RunTaskRequest) (*sandbox.ExecResult, error) {
	info, h, err := e.sandboxHandler(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(lang.Tasks, req.Task) {
		return nil, errdefs.Invalidf("task: must be one of %s, got %q", strings.Join(lang.Tasks, ", "), req.Task)
	}
	argv, ok := h.Tasks[req.Task]
	if !ok {
		return nil, errdefs.Invalidf("task: %s has no %s task (it has: %s)", h.Name, req.Task, strings.Join(h.TaskNames(), ", "))
	}
	target := "."
	if req.Path != "" {
		if req.Path != lang.Workspace {
			if target, err = workspaceRel("path", req.Path); err != nil {
				return nil, err
			}
		}
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	timeout, err := e.runBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	vars := lang.Vars{Path: target, File: target, Out: buildRoot + "/task"}
	if slices.Contains(argv, "{files}") {
		if vars.Files, err = e.sourcesUnder(ctx, info.ID, h, target); err != nil {
			return nil, err
		}
		if len(vars.Files) == 0 {
			return nil, errdefs.Invalidf("path: no %s files under %s", strings.Join(h.Extensions, "/"), path.Join(lang.Workspace, target))
		}
	}
	res, err := e.sandboxes.Exec(ctx, info.ID, sandbox.ExecSpec{
		Argv: lang.Expand(argv, vars), Env: req.Env, Cwd: lang.Workspace, Timeout: timeout, MaxResultBytes: req.MaxOutputBytes,
	}, nil)
	if err == nil {
		e.metrics.execTime.Observe(float64(res.DurationMS) / 1000)
		e.metrics.causes.WithLabelValues(res.Termination.Cause).Inc()
	}
	return res, err
}

// sourcesUnder lists the language's sources under target (relative to
// /workspace; a file is its own list), relative to /workspace.
func (e *Engine) sourcesUnder(ctx context.Context, id string, h *lang.Handler, target string) ([]string, error) {
	if h.IsSource(target) {
		return []string{target}, nil
	}
	dir := path.Join(lang.Workspace, target)
	entries, err := e.sandboxes.ListFiles(ctx, id, dir, true)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.NotFound {
			return nil, errdefs.Invalidf("path: %s does not exist", dir)
		}
		return nil, err
	}
	var out []string
	for _, fi := range entries {
		rel := strings.TrimPrefix(fi.Path, lang.Workspace+"/")
		if fi.Type != agent.TypeFile || !h.IsSource(rel) {
			continue
		}
		skip := false
		for _, part := range strings.Split(path.Dir(rel), "/") {
			skip = skip || slices.Contains(skipDirs, part)
		}
		if !skip {
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out, nil
}

// PackagesInstallRequest is the input of packages_install.
type PackagesInstallRequest struct {
	SandboxID      string   `json:"sandbox_id"`
	Manager        string   `json:"manager"`
	Packages       []string `json:"packages"`
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty"`
	MaxOutputBytes int64    `json:"-"`
}

// PackagesInstall adds packages to a sandbox with one of its language's
// package managers. From a sandbox without network only local sources
// (files in the sandbox) can work; a manager that needed the network gives
// an unavailable error.
func (e *Engine) PackagesInstall(ctx context.Context, req PackagesInstallRequest) (*sandbox.ExecResult, error) {
	info, h, err := e.sandboxHandler(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	d, ok := h.Manager(req.Manager)
	if !ok || len(d.Add) == 0 {
		return nil, errdefs.Invalidf("manager: %s sandboxes have no package manager %q (they have: %s)", h.Name, req.Manager, strings.Join(h.Managers(), ", "))
	}
	if len(req.Packages) == 0 {
		return nil, errdefs.Invalidf("packages: required")
	}
	if len(req.Packages) > 256 {
		return nil, errdefs.Invalidf("packages: at most 256")
	}
	for i, p := range req.Packages {
		if p == "" || strings.HasPrefix(p, "-") || strings.ContainsAny(p, "\x00\n") || len(p) > 1024 {
			return nil, errdefs.Invalidf("packages[%d]: %q is not a package name or path", i, p)
		}
	}
	timeout, err := e.runBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	offline := info.Network == "" || info.Network == "none"
	env := map[string]string{}
	if offline {
		for k, v := range d.OfflineEnv {
			env[k] = v
		}
	}
	res, err := e.sandboxes.Exec(ctx, info.ID, sandbox.ExecSpec{
		Argv: lang.Expand(d.Add, lang.Vars{Packages: req.Packages}), Env: env, Cwd: lang.Workspace,
		Timeout: timeout, MaxResultBytes: req.MaxOutputBytes,
	}, nil)
	if err != nil {
		return nil, err
	}
	if offline && !(res.Termination.Cause == sandbox.CauseExited && res.ExitCode == 0) && lang.NeededNetwork(d, res.Stdout+res.Stderr) {
		return res, errdefs.Unavailablef("packages: %s needs the network to fetch %s and sandbox %s has no network (network: none); install from local files instead",
			d.Manager, strings.Join(req.Packages, " "), info.ID)
	}
	return res, nil
}

// LanguageInfo is one entry of languages_list.
type LanguageInfo = apitypes.LanguageInfo

// Languages lists the enabled languages. An image is ready when it is
// built from the current recipe; the version is that of the recipe's first
// package in the built image (empty until it is built).
func (e *Engine) Languages(ctx context.Context) ([]LanguageInfo, error) {
	b := &image.Builder{Store: e.images, Mirror: e.cfg.Images.Mirror, Suite: e.cfg.Images.Suite}
	var out []LanguageInfo
	for _, name := range e.languageNames() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := e.recipes[name]
		h, err := lang.New(r)
		if err != nil {
			continue
		}
		li := LanguageInfo{Name: name, Image: name, Extensions: h.Extensions, Entrypoint: h.Entrypoint,
			Tasks: h.TaskNames(), Managers: h.Managers(), Compiled: h.Compiled(), Description: r.Description}
		if li.Tasks == nil {
			li.Tasks = []string{}
		}
		if img, err := e.images.Get(name); err == nil {
			if want, err := b.Digest(r); err == nil && want == img.Digest {
				li.ImageReady = true
			}
			li.Version = imageVersion(img, r)
		}
		out = append(out, li)
	}
	return out, nil
}

// imageVersion is the Debian version of the first of the recipe's packages
// (or, for setup-installed toolchains, of the first package named in a
// setup line) that the image holds.
func imageVersion(img *image.Image, r *image.Recipe) string {
	cands := slices.Clone(r.Packages)
	for _, line := range r.Setup {
		if i := strings.Index(line, " install "); i >= 0 {
			for _, f := range strings.Fields(line[i:]) {
				if !strings.HasPrefix(f, "-") && f != "install" {
					cands = append([]string{f}, cands...)
				}
			}
		}
	}
	for _, p := range cands {
		if v, ok := img.Packages[p]; ok {
			return v
		}
	}
	return ""
}

// GetRun returns a run record with up to maxLog bytes of each log (0: the
// default, 1 MiB).
func (e *Engine) GetRun(ctx context.Context, id string, maxLog int64) (*runs.Run, error) {
	rs, err := e.runStore()
	if err != nil {
		return nil, err
	}
	if maxLog <= 0 {
		maxLog = 1 << 20
	}
	return rs.Get(ctx, id, maxLog)
}

// RunFilter selects run records (run_list).
type RunFilter = apitypes.RunFilter

// ListRuns lists run records, newest first.
func (e *Engine) ListRuns(ctx context.Context, f RunFilter) ([]runs.Metadata, error) {
	rs, err := e.runStore()
	if err != nil {
		return nil, err
	}
	switch {
	case f.Limit < 0:
		return nil, errdefs.Invalidf("limit: must not be negative")
	case f.Limit == 0:
		f.Limit = 50
	case f.Limit > 1000:
		return nil, errdefs.Invalidf("limit: %d exceeds the maximum 1000", f.Limit)
	}
	return rs.List(ctx, store.RunFilter{Limit: f.Limit, Language: f.Language, Success: f.Success})
}
