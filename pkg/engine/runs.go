package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/fixloop"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// The run pipeline (run_code, run_task, packages_install, run records) and
// the autofix loops are services (pkg/services/pipeline,
// pkg/services/fixloop). The engine keeps the front ends' methods as a
// facade, so that every front end's narrow interface still holds, and
// gives the services their narrow views of itself (lifecycle, runMetrics).

type (
	// RunCodeRequest is the input of run_code.
	RunCodeRequest = apitypes.RunCodeRequest
	// RunStep is the outcome of one step of a run.
	RunStep = apitypes.RunStep
	// RunResult is the outcome of run_code.
	RunResult = apitypes.RunResult
	// RunTaskRequest is the input of run_task.
	RunTaskRequest = apitypes.RunTaskRequest
	// PackagesInstallRequest is the input of packages_install.
	PackagesInstallRequest = apitypes.PackagesInstallRequest
	// RunFilter selects run records (run_list).
	RunFilter = apitypes.RunFilter
	// AutofixRequest is the input of autofix.
	AutofixRequest = apitypes.AutofixRequest
	// AutofixSubmitRequest is the input of autofix_submit.
	AutofixSubmitRequest = apitypes.AutofixSubmitRequest
	// AutofixResult is the answer of autofix, autofix_submit and
	// autofix_status.
	AutofixResult = apitypes.AutofixResult
	// AutofixOptions are what a front end adds to an autofix call.
	AutofixOptions = fixloop.CallOptions
)

// Limits of run_code's input, and the names of a run's steps.
const (
	MaxRunFiles      = pipeline.MaxRunFiles
	MaxRunFilesBytes = pipeline.MaxRunFilesBytes
	StepInstall      = pipeline.StepInstall
	StepCompile      = pipeline.StepCompile
	StepRun          = pipeline.StepRun
)

// Replays is run replay, for the front ends to take as it is.
func (e *Engine) Replays() pipeline.Replays { return e.pipeline }

// RunCode runs source code (pipeline.Service.RunCode).
func (e *Engine) RunCode(ctx context.Context, req RunCodeRequest, onOutput sandbox.OutputFunc) (*RunResult, error) {
	ctx, span := telemetry.StartOp(ctx, "run_code", telemetry.KeyLanguage.String(req.Language), telemetry.Sandbox(req.SandboxID))
	res, err := e.pipeline.RunCode(ctx, req, onOutput)
	if res != nil {
		span.SetAttributes(telemetry.Sandbox(res.SandboxID))
		e.announceRun(ctx, res)
	}
	return res, telemetry.End(span, err)
}

// RunTask runs the sandbox language's lint, build or test command.
func (e *Engine) RunTask(ctx context.Context, req RunTaskRequest) (*sandbox.ExecResult, error) {
	return e.pipeline.RunTask(ctx, req)
}

// PackagesInstall adds packages to a sandbox with one of its language's
// package managers.
func (e *Engine) PackagesInstall(ctx context.Context, req PackagesInstallRequest) (*sandbox.ExecResult, error) {
	return e.pipeline.PackagesInstall(ctx, req)
}

// GetRun returns a run record with up to maxLog bytes of each log.
func (e *Engine) GetRun(ctx context.Context, id string, maxLog int64) (*runs.Run, error) {
	return e.pipeline.GetRun(ctx, id, maxLog)
}

// ListRuns lists run records, newest first.
func (e *Engine) ListRuns(ctx context.Context, f RunFilter) ([]runs.Metadata, error) {
	return e.pipeline.ListRuns(ctx, f)
}

// Autofix runs a program and, while it fails, asks a provider for fixes.
func (e *Engine) Autofix(ctx context.Context, req AutofixRequest, opts AutofixOptions) (*AutofixResult, error) {
	ctx, span := telemetry.StartOp(ctx, "autofix", telemetry.KeyLanguage.String(req.Language))
	res, err := e.fixes.Autofix(ctx, req, opts)
	return res, telemetry.End(span, err)
}

// AutofixSubmit continues a client-provider loop with the client's fix.
func (e *Engine) AutofixSubmit(ctx context.Context, req AutofixSubmitRequest, opts AutofixOptions) (*AutofixResult, error) {
	return e.fixes.AutofixSubmit(ctx, req, opts)
}

// AutofixStatus reports a loop.
func (e *Engine) AutofixStatus(ctx context.Context, id string) (*AutofixResult, error) {
	return e.fixes.AutofixStatus(ctx, id)
}

// ExportCorrections writes the corrections of every autofix run record.
func (e *Engine) ExportCorrections(ctx context.Context, emit func(apitypes.CorrectionRecord) error) error {
	return e.fixes.ExportCorrections(ctx, emit)
}

// lifecycle is the engine as its services see it (services.Engine):
// sandboxes created and terminated, and files moved, with the engine's
// validation, defaults and caps, and the network modes this daemon has.
type lifecycle struct{ *Engine }

func (l lifecycle) CreateRunVM(ctx context.Context, language string, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	return l.createRunVM(ctx, language, req)
}

func (l lifecycle) NetworkMode(field, mode string) (string, error) {
	return l.networkMode(field, mode)
}

// runMetrics counts the pipeline's commands and runs on the engine's
// instruments (shared with exec_command).
type runMetrics struct{ m *metrics }

func (r runMetrics) Exec(res *sandbox.ExecResult) {
	r.m.execTime.Observe(float64(res.DurationMS) / 1000)
	r.m.causes.WithLabelValues(res.Termination.Cause).Inc()
}

func (r runMetrics) Run(language, outcome string) { r.m.runs.WithLabelValues(language, outcome).Inc() }
