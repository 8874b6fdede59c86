package api

import (
	"context"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Engine is what the REST API needs of the engine: one method per route,
// declared here, beside its only user, so that the handlers' decode and
// encode tests run against a fake without root (fake_test.go) while the
// daemon passes its *engine.Engine.
type Engine interface {
	vmEngine

	// System.
	Uptime() time.Duration
	Readiness(ctx context.Context) []apitypes.Check
	Status(ctx context.Context) (*apitypes.Status, error)
	NodeStatus(ctx context.Context) (*apitypes.NodeStatus, error)
	SetDraining(ctx context.Context, draining bool) (*apitypes.NodeStatus, error)
	MetricsRegistry() *prometheus.Registry
	GC(ctx context.Context) (*apitypes.GCReport, error)
	SubscribeEvents(ctx context.Context, id string) <-chan apitypes.Event

	// Sandboxes.
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error)
	ListSandboxes(ctx context.Context, state string) ([]*apitypes.Sandbox, error)
	GetSandbox(ctx context.Context, id string) (*apitypes.SandboxDetail, error)
	TerminateSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	PauseSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	SandboxNetwork(ctx context.Context, req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error)
	ExposePort(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error)
	Ports(ctx context.Context, id string) ([]apitypes.PortExposure, error)
	UnexposePort(ctx context.Context, id string, port int) error

	// SSH access (pkg/sshd).
	SSHEndpoint(ctx context.Context) (*apitypes.SSHEndpoint, error)
	SSHKeyList(ctx context.Context) (*apitypes.SSHKeyList, error)
	SSHKeyAdd(ctx context.Context, req apitypes.SSHKeyAddRequest) (*apitypes.SSHKey, error)
	SSHKeyRemove(ctx context.Context, id string) error
	SSHToken(ctx context.Context, req apitypes.SSHTokenRequest) (*apitypes.SSHToken, error)

	// Commands and jobs.
	Exec(ctx context.Context, req apitypes.ExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error)
	StartJob(ctx context.Context, req apitypes.ExecRequest) (string, error)
	ListJobs(ctx context.Context, id string) ([]apitypes.JobInfo, error)
	JobStatus(ctx context.Context, req apitypes.JobStatusRequest) (*apitypes.JobStatus, error)
	KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error)
	OpenTerminal(ctx context.Context, req apitypes.TerminalRequest) (*sandbox.Terminal, error)
	RunTask(ctx context.Context, req apitypes.RunTaskRequest) (*apitypes.ExecResult, error)
	PackagesInstall(ctx context.Context, req apitypes.PackagesInstallRequest) (*apitypes.ExecResult, error)

	// Files.
	WriteFileFrom(ctx context.Context, id, p, modeText string, appendTo bool, size int64, r io.Reader) (*apitypes.FileResult, error)
	ReadFileRaw(ctx context.Context, req apitypes.FileReadRequest) (*agent.FileData, error)
	ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error)
	DeleteFile(ctx context.Context, id, p string, recursive bool) (*apitypes.FileResult, error)
	ExportFiles(ctx context.Context, id, dir string) (*apitypes.Artifact, error)
	OpenArtifact(ctx context.Context, id string) (*apitypes.Artifact, io.ReadCloser, error)

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
	GetSnapshot(ctx context.Context, id string) (*apitypes.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error

	// Runs, autofix and agents.
	RunCode(ctx context.Context, req apitypes.RunCodeRequest, onOutput sandbox.OutputFunc) (*apitypes.RunResult, error)
	ListRuns(ctx context.Context, f apitypes.RunFilter) ([]apitypes.RunMetadata, error)
	GetRun(ctx context.Context, id string, maxLog int64) (*apitypes.RunRecord, error)
	ExportCorrections(ctx context.Context, emit func(apitypes.CorrectionRecord) error) error
	Autofix(ctx context.Context, req apitypes.AutofixRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error)
	AutofixSubmit(ctx context.Context, req apitypes.AutofixSubmitRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error)
	AutofixStatus(ctx context.Context, id string) (*apitypes.AutofixResult, error)
	AgentRun(ctx context.Context, req apitypes.AgentRunRequest, progress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error)

	// Languages and images.
	Languages(ctx context.Context) ([]apitypes.LanguageInfo, error)
	ImageList(ctx context.Context) (*apitypes.ImageList, error)
	EnsureImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error)
	EnsureVMImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error)
	RemoveImage(ctx context.Context, name string) error
	PruneImages(ctx context.Context) ([]apitypes.Image, error)

	// API keys (pkg/tenants through the engine, which checks the scope).
	CreateKey(ctx context.Context, req apitypes.KeyCreateRequest) (*apitypes.KeySecret, error)
	ListKeys(ctx context.Context) ([]apitypes.Key, error)
	RevokeKey(ctx context.Context, id string) (*apitypes.Key, error)
	RotateKey(ctx context.Context, id string) (*apitypes.KeySecret, error)
	KeyUsage(ctx context.Context, id string) (*apitypes.KeyUsage, error)
	PullImage(ctx context.Context, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error)
	ImportImageFrom(ctx context.Context, r io.Reader, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error)
	BuildDockerfile(ctx context.Context, req apitypes.DockerfileBuildRequest, ctxTar io.Reader, progress func(apitypes.BuildProgress)) (*apitypes.Image, error)
}

// The daemon's engine is the REST API's engine.
var _ Engine = (*engine.Engine)(nil)
