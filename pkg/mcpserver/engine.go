package mcpserver

import (
	"context"
	"io"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Engine is what the MCP tools need of the engine: one method per tool,
// declared here, beside its only user, so that the tools' decode and
// encode tests run against a fake without root (fake_test.go) while the
// daemon passes its *engine.Engine.
type Engine interface {
	vmEngine

	// Config is the daemon's configuration: the tool groups, the result
	// budget and the limits the tool descriptions state.
	Config() *config.Config

	// Sandboxes.
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error)
	ListSandboxes(ctx context.Context, state string) ([]*apitypes.Sandbox, error)
	GetSandbox(ctx context.Context, id string) (*apitypes.SandboxDetail, error)
	TerminateSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	TerminateLabeled(ctx context.Context, key, value, reason string) ([]string, error)
	PauseSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	SandboxNetwork(ctx context.Context, req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error)
	// WatchNetwork: a call's watch of its sandbox's DNS refusals
	// (network approvals, elicit.go).
	WatchNetwork(ctx context.Context, id string, w engine.NetworkWatch) (stop func(), err error)
	ExposePort(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error)

	// Commands and jobs.
	Exec(ctx context.Context, req apitypes.ExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error)
	StartJob(ctx context.Context, req apitypes.ExecRequest) (string, error)
	JobStatus(ctx context.Context, req apitypes.JobStatusRequest) (*apitypes.JobStatus, error)
	KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error)
	RunTask(ctx context.Context, req apitypes.RunTaskRequest) (*apitypes.ExecResult, error)
	PackagesInstall(ctx context.Context, req apitypes.PackagesInstallRequest) (*apitypes.ExecResult, error)

	// Files.
	WriteFile(ctx context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error)
	ReadFile(ctx context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error)
	ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error)
	DeleteFile(ctx context.Context, id, p string, recursive bool) (*apitypes.FileResult, error)
	ExportFiles(ctx context.Context, id, dir string) (*apitypes.Artifact, error)

	// Templates.
	CreateTemplate(ctx context.Context, req apitypes.TemplateCreateRequest) (*apitypes.Template, error)
	ListTemplates(ctx context.Context) (*apitypes.TemplateList, error)
	GetTemplate(ctx context.Context, name string) (*apitypes.Template, error)
	DeleteTemplate(ctx context.Context, name string) error
	// Named volumes.
	CreateVolume(ctx context.Context, req apitypes.VolumeCreateRequest) (*apitypes.Volume, error)
	ListVolumes(ctx context.Context) (*apitypes.VolumeList, error)
	GetVolume(ctx context.Context, name string) (*apitypes.Volume, error)
	DeleteVolume(ctx context.Context, name string) error
	// Snapshots.
	SnapshotSandbox(ctx context.Context, req apitypes.SnapshotRequest) (*apitypes.Snapshot, error)
	RestoreSandbox(ctx context.Context, req apitypes.RestoreRequest) (*apitypes.Sandbox, error)
	ListSnapshots(ctx context.Context, sandboxID string) ([]apitypes.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error

	// Runs, autofix and agents.
	RunCode(ctx context.Context, req apitypes.RunCodeRequest, onOutput sandbox.OutputFunc) (*apitypes.RunResult, error)
	ListRuns(ctx context.Context, f apitypes.RunFilter) ([]apitypes.RunMetadata, error)
	GetRun(ctx context.Context, id string, maxLog int64) (*apitypes.RunRecord, error)
	Autofix(ctx context.Context, req apitypes.AutofixRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error)
	AutofixSubmit(ctx context.Context, req apitypes.AutofixSubmitRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error)
	AutofixStatus(ctx context.Context, id string) (*apitypes.AutofixResult, error)
	AgentRun(ctx context.Context, req apitypes.AgentRunRequest, progress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error)

	// The caller's key's quota and use ("" id: the caller's own).
	KeyUsage(ctx context.Context, id string) (*apitypes.KeyUsage, error)

	// Languages and images.
	Languages(ctx context.Context) ([]apitypes.LanguageInfo, error)
	ImageList(ctx context.Context) (*apitypes.ImageList, error)
	EnsureImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error)
	EnsureVMImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error)
	PullImage(ctx context.Context, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error)
	BuildDockerfile(ctx context.Context, req apitypes.DockerfileBuildRequest, ctxTar io.Reader, progress func(apitypes.BuildProgress)) (*apitypes.Image, error)
	RemoveImage(ctx context.Context, name string) error
}

// The daemon's engine is the MCP tools' engine.
var _ Engine = (*engine.Engine)(nil)
