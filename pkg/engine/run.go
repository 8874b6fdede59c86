package engine

import (
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

// newRunRecord creates the directory and metadata of a new run record.
func (e *Engine) newRunRecord() (*runs.Record, error) {
	rs, err := e.runStore()
	if err != nil {
		return nil, err
	}
	rec, err := rs.Create()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create run record")
	}
	return rec, nil
}

// RunCodeRequest is the input of run_code.
type RunCodeRequest = apitypes.RunCodeRequest

// RunStep is the outcome of one step of a run.
type RunStep = apitypes.RunStep

// RunResult is the outcome of run_code: the steps, and at the top level the
// last step that ran (the run step, or the one that failed).
type RunResult = apitypes.RunResult

// runBudget is the run's total time limit.
func (e *Engine) runBudget(field string, secs *float64) (time.Duration, error) {
	sc := e.cfg.Sandbox
	if secs == nil {
		return sc.ExecTimeout.D(), nil
	}
	return duration(field, *secs, sc.MaxExecTimeout.D())
}

// RunCode runs source code: it writes the files into a sandbox (the given
// one, or an ephemeral one terminated afterwards), installs dependencies,
// compiles and runs, keeps a run record, and returns the steps' outcomes.
// onOutput, if not nil, receives every step's output as it arrives.
func (e *Engine) RunCode(ctx context.Context, req RunCodeRequest, onOutput sandbox.OutputFunc) (*RunResult, error) {
	h, files, main, err := e.program(req.Language, req.Code, req.Files, req.Entrypoint, req.Args, req.Stdin)
	if err != nil {
		return nil, err
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	budget, err := e.runBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	network, err := e.networkMode("network", req.Network)
	if err != nil {
		return nil, err
	}
	switch req.Backend {
	case "", "container", BackendVM:
	default:
		return nil, errdefs.Invalidf("backend: must be container or vm, got %q", req.Backend)
	}
	// An image built on first use streams its phases like the run's output.
	run, err := e.StartRun(withBuildOutput(ctx, onOutput), RunSpec{
		Handler: h, SandboxID: req.SandboxID, Backend: req.Backend, Entrypoint: main, Args: req.Args, Deadline: time.Now().Add(budget),
		Sandbox: CreateSandboxRequest{Network: network, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, CPUs: req.CPUs, Root: req.Root},
	})
	if err != nil {
		return nil, err
	}
	var stdin []byte
	if req.Stdin != "" {
		stdin = []byte(req.Stdin)
	}
	res, runErr := run.Run(ctx, Attempt{Files: files, Main: main, Args: req.Args, Stdin: stdin, Env: req.Env,
		Install: req.Install == nil || *req.Install, MaxOutputBytes: req.MaxOutputBytes, OnOutput: onOutput})
	if err := run.Finish(context.WithoutCancel(ctx), res, runErr); err != nil && runErr == nil {
		e.log.Error("write run record", "run", run.Record.ID, "err", err)
	}
	if runErr != nil {
		return nil, runErr
	}
	return res, nil
}

// RunTaskRequest is the input of run_task.
type RunTaskRequest = apitypes.RunTaskRequest

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
	r, ok := e.catalog.Recipe(info.Image)
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
			if target, err = WorkspaceRel("path", req.Path); err != nil {
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
type PackagesInstallRequest = apitypes.PackagesInstallRequest

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
	for _, name := range e.catalog.Names() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, _ := e.catalog.Recipe(name)
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
			li.Version = lang.ImageVersion(img, r)
		}
		out = append(out, li)
	}
	return out, nil
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
	r, err := rs.Get(ctx, id, maxLog)
	if err == nil && !e.ownRun(ctx, &r.Metadata, nil) {
		return nil, errdefs.NotFoundf("run %s not found", id) // runs.Store.Get's own words
	}
	return r, err
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
	return e.ownRuns(ctx, f.Limit, func(limit int) ([]runs.Metadata, error) {
		return rs.List(ctx, store.RunFilter{Limit: limit, Language: f.Language, Success: f.Success})
	})
}
