// Package pipeline is the run pipeline service: run_code, run_task and
// packages_install, and the run records they keep (pkg/runs). A CodeRun is
// one record bound to one sandbox; each Attempt runs a language's steps —
// install, compile, run — in it. The autofix loops (pkg/services/fixloop)
// and agent sessions (pkg/services/agents) write their records through it.
// It needs of the sandbox manager and of the engine only what its
// Sandboxes and Lifecycle interfaces name, so it never imports pkg/engine.
package pipeline

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/images"
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

// Sandboxes is what the pipeline needs of the sandbox manager: the live
// sandbox's state and the agent operations a run's steps use.
type Sandboxes interface {
	Get(ctx context.Context, id string) (*sandbox.Info, error)
	Exec(ctx context.Context, id string, spec sandbox.ExecSpec, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error)
	WriteFile(ctx context.Context, id string, req agent.WriteFileRequest, content io.Reader) (*agent.FileInfo, error)
	ReadFile(ctx context.Context, id, path string, offset, max int64) (*agent.FileData, error)
	ListFiles(ctx context.Context, id, path string, recursive bool) ([]agent.FileInfo, error)
	DeleteFile(ctx context.Context, id, path string, recursive bool) error
}

// Lifecycle is what the pipeline needs of the engine: sandboxes created and
// terminated with the engine's validation, defaults and caps (an ephemeral
// run's sandbox is an ordinary one), and the network mode a request may
// have on this daemon.
type Lifecycle interface {
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	// CreateRunVM starts the VM of a run with backend "vm": the language's
	// guest image.
	CreateRunVM(ctx context.Context, language string, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error)
	// NetworkMode resolves a request's network mode (empty: the default),
	// or refuses it naming field.
	NetworkMode(field, mode string) (string, error)
}

// Metrics counts what the pipeline ran (the daemon's Prometheus
// instruments, shared with exec_command).
type Metrics interface {
	// Exec counts one finished command.
	Exec(res *sandbox.ExecResult)
	// Run counts one finished run by language and outcome (success,
	// failure, error).
	Run(language, outcome string)
}

// Options are what New needs.
type Options struct {
	Sandboxes Sandboxes
	Lifecycle Lifecycle
	Catalog   *lang.Catalog
	// Store indexes the run records (the state database).
	Store *store.Store
	// Runs configures the records' directory (empty: StateDir/runs), log
	// cap and retention.
	Runs     config.Runs
	StateDir string
	// ExecTimeout is a run's default budget, MaxExecTimeout its cap
	// (sandbox.exec_timeout, sandbox.max_exec_timeout).
	ExecTimeout, MaxExecTimeout time.Duration
	Metrics                     Metrics
	Log                         *slog.Logger
}

// Service runs programs and keeps their records.
type Service struct {
	sandboxes Sandboxes
	life      Lifecycle
	catalog   *lang.Catalog
	metrics   Metrics
	log       *slog.Logger
	opts      Options

	runsOnce sync.Once
	runs     *runs.Store
	runsErr  error

	// releases are the ephemeral sandboxes being terminated after their
	// run answered (CodeRun.FinishAndRelease); releasesIdle is closed
	// whenever there are none.
	releasesMu   sync.Mutex
	releases     int
	released     uint64 // releases ended, ever
	releasesIdle chan struct{}
}

// New returns the pipeline; Open opens its records store.
func New(o Options) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Service{sandboxes: o.Sandboxes, life: o.Lifecycle, catalog: o.Catalog, metrics: o.Metrics, log: o.Log, opts: o}
}

// Open opens the run records store and applies its retention. The
// composition root calls it at start-up; every use also calls it, so that
// it happens once either way.
func (s *Service) Open() error {
	s.runsOnce.Do(func() {
		rc := s.opts.Runs
		dir := rc.Dir
		if dir == "" {
			dir = filepath.Join(s.opts.StateDir, "runs")
		}
		s.runs, s.runsErr = runs.Open(dir, s.opts.Store, runs.Options{
			LogCap: int64(rc.LogCap), MaxAge: rc.MaxAge.D(), MaxTotalSize: int64(rc.MaxTotalSize),
		})
		if s.runsErr != nil {
			s.runsErr = fmt.Errorf("open run records: %w", s.runsErr)
			return
		}
		if n, err := s.runs.Prune(context.Background()); err != nil {
			s.log.Warn("run records retention", "err", err)
		} else if n > 0 {
			s.log.Info("run records retention", "deleted", n)
		}
	})
	return s.runsErr
}

// Records returns the run records store, opening it on first use.
func (s *Service) Records() (*runs.Store, error) {
	if err := s.Open(); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "run records")
	}
	return s.runs, nil
}

// NewRecord creates the directory and metadata of a new run record.
func (s *Service) NewRecord() (*runs.Record, error) {
	rs, err := s.Records()
	if err != nil {
		return nil, err
	}
	rec, err := rs.Create()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create run record")
	}
	return rec, nil
}

// FinishRecord writes a record's metadata.json and indexes it.
func (s *Service) FinishRecord(ctx context.Context, r *runs.Record, m *runs.Metadata) error {
	rs, err := s.Records()
	if err != nil {
		return err
	}
	return rs.Finish(ctx, r, m)
}

// RunCodeRequest is the input of run_code.
type RunCodeRequest = apitypes.RunCodeRequest

// RunStep is the outcome of one step of a run.
type RunStep = apitypes.RunStep

// RunResult is the outcome of run_code: the steps, and at the top level the
// last step that ran (the run step, or the one that failed).
type RunResult = apitypes.RunResult

// RunBudget is the run's total time limit.
func (s *Service) RunBudget(field string, secs *float64) (time.Duration, error) {
	if secs == nil {
		return s.opts.ExecTimeout, nil
	}
	return apitypes.Seconds(field, *secs, s.opts.MaxExecTimeout)
}

// RunCode runs source code: it writes the files into a sandbox (the given
// one, or an ephemeral one terminated afterwards), installs dependencies,
// compiles and runs, keeps a run record, and returns the steps' outcomes.
// onOutput, if not nil, receives every step's output as it arrives.
func (s *Service) RunCode(ctx context.Context, req RunCodeRequest, onOutput sandbox.OutputFunc) (*RunResult, error) {
	return s.runCode(ctx, req, onOutput, nil)
}

// replayPin is what a replay adds to a run_code request (replay.go).
type replayPin struct {
	of     string // the replayed run
	digest string // its image digest
	pids   int64  // its sandbox's process limit
}

func (s *Service) runCode(ctx context.Context, req RunCodeRequest, onOutput sandbox.OutputFunc, pin *replayPin) (*RunResult, error) {
	h, files, main, err := s.Program(req.Language, req.Code, req.Files, req.Entrypoint, req.Args, req.Stdin)
	if err != nil {
		return nil, err
	}
	if err := apitypes.CheckEnv("env", req.Env); err != nil {
		return nil, err
	}
	budget, err := s.RunBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	network, err := s.life.NetworkMode("network", req.Network)
	if err != nil {
		return nil, err
	}
	switch req.Backend {
	case "", "container", BackendVM:
	default:
		return nil, errdefs.Invalidf("backend: must be container or vm, got %q", req.Backend)
	}
	// An image built on first use streams its phases like the run's output.
	spec := RunSpec{
		Handler: h, SandboxID: req.SandboxID, Backend: req.Backend, Entrypoint: main, Args: req.Args, Deadline: time.Now().Add(budget),
		Sandbox: apitypes.CreateSandboxRequest{Network: network, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, CPUs: req.CPUs, Root: req.Root},
	}
	if pin != nil {
		spec.ReplayOf, spec.Sandbox.ImageDigest = pin.of, pin.digest
		if pin.pids > 0 {
			spec.Sandbox.Pids = &pin.pids
		}
	}
	run, err := s.StartRun(images.WithBuildOutput(ctx, onOutput), spec)
	if err != nil {
		return nil, err
	}
	install := req.Install == nil || *req.Install
	// What run_replay needs besides the files and the sandbox's limits.
	if err := run.Record.WriteJSON(runs.InputsJSON, runs.Inputs{Stdin: req.Stdin, Env: req.Env, Install: install,
		TimeoutMS: budget.Milliseconds(), Backend: req.Backend, Root: req.Root}); err != nil {
		err = errdefs.Wrap(errdefs.Internal, err, "write run inputs")
		_ = run.FinishAndRelease(context.WithoutCancel(ctx), nil, err)
		return nil, err
	}
	var stdin []byte
	if req.Stdin != "" {
		stdin = []byte(req.Stdin)
	}
	res, runErr := run.Run(ctx, Attempt{Files: files, Main: main, Args: req.Args, Stdin: stdin, Env: req.Env,
		Install: install, MaxOutputBytes: req.MaxOutputBytes, OnOutput: onOutput})
	if err := run.FinishAndRelease(context.WithoutCancel(ctx), res, runErr); err != nil && runErr == nil {
		s.log.Error("write run record", "run", run.Record.ID, "err", err)
	}
	if runErr != nil {
		return nil, runErr
	}
	return res, nil
}

// RunTaskRequest is the input of run_task.
type RunTaskRequest = apitypes.RunTaskRequest

// sandboxHandler returns a live sandbox and its language's handler.
func (s *Service) sandboxHandler(ctx context.Context, id string) (*sandbox.Info, *lang.Handler, error) {
	if err := sandbox.CheckID(id); err != nil {
		return nil, nil, err
	}
	info, err := s.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if !(info.State == sandbox.StateReady || info.State == sandbox.StateRunning) {
		return nil, nil, errdefs.Conflictf("sandbox %s is %s", info.ID, info.State)
	}
	r, ok := s.catalog.Recipe(info.Image)
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
func (s *Service) RunTask(ctx context.Context, req RunTaskRequest) (*sandbox.ExecResult, error) {
	info, h, err := s.sandboxHandler(ctx, req.SandboxID)
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
	if err := apitypes.CheckEnv("env", req.Env); err != nil {
		return nil, err
	}
	timeout, err := s.RunBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	vars := lang.Vars{Path: target, File: target, Out: buildRoot + "/task"}
	if slices.Contains(argv, "{files}") {
		if vars.Files, err = s.sourcesUnder(ctx, info.ID, h, target); err != nil {
			return nil, err
		}
		if len(vars.Files) == 0 {
			return nil, errdefs.Invalidf("path: no %s files under %s", strings.Join(h.Extensions, "/"), path.Join(lang.Workspace, target))
		}
	}
	res, err := s.sandboxes.Exec(ctx, info.ID, sandbox.ExecSpec{
		Argv: lang.Expand(argv, vars), Env: req.Env, Cwd: lang.Workspace, Timeout: timeout, MaxResultBytes: req.MaxOutputBytes,
	}, nil)
	if err == nil {
		s.metrics.Exec(res)
	}
	return res, err
}

// sourcesUnder lists the language's sources under target (relative to
// /workspace; a file is its own list), relative to /workspace.
func (s *Service) sourcesUnder(ctx context.Context, id string, h *lang.Handler, target string) ([]string, error) {
	if h.IsSource(target) {
		return []string{target}, nil
	}
	dir := path.Join(lang.Workspace, target)
	entries, err := s.sandboxes.ListFiles(ctx, id, dir, true)
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
func (s *Service) PackagesInstall(ctx context.Context, req PackagesInstallRequest) (*sandbox.ExecResult, error) {
	info, h, err := s.sandboxHandler(ctx, req.SandboxID)
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
	timeout, err := s.RunBudget("timeout_seconds", req.TimeoutSeconds)
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
	res, err := s.sandboxes.Exec(ctx, info.ID, sandbox.ExecSpec{
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

// GetRun returns a run record with up to maxLog bytes of each log (0: the
// default, 1 MiB).
func (s *Service) GetRun(ctx context.Context, id string, maxLog int64) (*runs.Run, error) {
	rs, err := s.Records()
	if err != nil {
		return nil, err
	}
	if maxLog <= 0 {
		maxLog = 1 << 20
	}
	r, err := rs.Get(ctx, id, maxLog)
	if err == nil && !s.ownRun(ctx, &r.Metadata, nil) {
		return nil, errdefs.NotFoundf("run %s not found", id) // runs.Store.Get's own words
	}
	return r, err
}

// RunFilter selects run records (run_list).
type RunFilter = apitypes.RunFilter

// ListRuns lists run records, newest first.
func (s *Service) ListRuns(ctx context.Context, f RunFilter) ([]runs.Metadata, error) {
	rs, err := s.Records()
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
	return s.ownRuns(ctx, f.Limit, func(limit int) ([]runs.Metadata, error) {
		return rs.List(ctx, store.RunFilter{Limit: limit, Language: f.Language, Success: f.Success})
	})
}
