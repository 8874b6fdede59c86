// Package services makes the engine's services — images, preview ports,
// the run pipeline, agent sessions, autofix loops, snapshots — over the
// engine's core: Compose is the one place a service is made and wired to
// what it needs. It sits beside pkg/engine and never imports it, so the
// daemon's composition root (cmd/mcp-sandboxd) and the engine's own tests
// compose the same services the same way.
package services

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/fixloop"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/images"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/snapshots"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/sshkeys"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Engine is the engine's validated operations, as the services go through
// them: a sandbox a service creates, or a file an agent session writes, is
// checked, defaulted and capped as a front end's would be.
type Engine interface {
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error)
	// CreateRunVM starts the VM of a run with backend "vm".
	CreateRunVM(ctx context.Context, language string, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	// NetworkMode resolves a request's network mode, or refuses it naming
	// field.
	NetworkMode(field, mode string) (string, error)
	WriteFile(ctx context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error)
	ReadFile(ctx context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error)
	ListFiles(ctx context.Context, id, p string, recursive bool) ([]apitypes.FileEntry, error)
}

// Core is what the engine's core (engine.Open) gives the services.
type Core struct {
	Config    *config.Config
	Log       *slog.Logger
	Sandboxes *sandbox.Manager
	Store     *store.Store
	Images    *image.Store
	Catalog   *lang.Catalog
	Engine    Engine
	// Registerer takes the services' own Prometheus instruments.
	Registerer prometheus.Registerer
	// Metrics counts the pipeline's commands and runs on the engine's
	// instruments (shared with exec_command); OnImageBuild sees each image
	// build on first use start and end.
	Metrics      pipeline.Metrics
	OnImageBuild func(name, outcome string)
	// Credentials says whether agent sessions have their credential, and
	// what a sandbox spent of it (the network's credential proxy).
	Credentials agents.Credentials
	// Audit is the audit log, where the webhooks service records a
	// webhook its failures disabled.
	Audit *audit.Log
	// MaxImageID is the highest uid and gid an imported image's files may
	// have: the size of a sandbox's user-namespace range.
	MaxImageID int
}

// Set is every service, made once.
type Set struct {
	Images    *images.Service
	Ports     *ports.Service
	Pipeline  *pipeline.Service
	Agents    *agents.Service
	Fixes     *fixloop.Service
	Snapshots *snapshots.Service
	SSHKeys   *sshkeys.Service
	Webhooks  *webhooks.Service
}

// Compose makes every service over the core, each given only the narrow
// interfaces its package declares. It starts nothing: the engine starts
// the background work once it holds the set (engine.Start).
func Compose(c Core) *Set {
	cfg, log := c.Config, c.Log
	s := &Set{}
	s.Images = images.New(images.Options{
		Store: c.Images, Catalog: c.Catalog, Config: &cfg.Images, RecipesDir: cfg.Paths.RecipesDir,
		Sandboxes: c.Sandboxes, Log: log, OnBuild: c.OnImageBuild, MaxID: c.MaxImageID,
	})
	s.Ports = ports.New(c.Sandboxes, c.Store, log)
	s.Pipeline = pipeline.New(pipeline.Options{Sandboxes: c.Sandboxes, Lifecycle: c.Engine, Catalog: c.Catalog,
		Store: c.Store, Runs: cfg.Runs, StateDir: cfg.Paths.StateDir, ExecTimeout: cfg.Sandbox.ExecTimeout.D(),
		MaxExecTimeout: cfg.Sandbox.MaxExecTimeout.D(), Metrics: c.Metrics, Log: log})
	s.Agents = agents.New(agents.Options{Sandboxes: agentSandboxes{c.Engine, c.Sandboxes}, Images: s.Images,
		Records: records{s.Pipeline}, Credentials: c.Credentials, MaxLifetime: cfg.Sandbox.MaxLifetime.D()})
	s.Fixes = fixloop.New(fixloop.Options{Pipeline: s.Pipeline, Sandboxes: c.Sandboxes, Lifecycle: c.Engine,
		Store: c.Store, Agents: fixAgents{s.Agents, c.Credentials}, Catalog: c.Catalog, Config: &cfg.Autofix,
		RecordsMaxAge: cfg.Runs.MaxAge.D(), Registerer: c.Registerer, Log: log})
	s.Snapshots = snapshots.New(c.Sandboxes, c.Store, cfg.Snapshots, cfg.Paths.StateDir, log)
	s.SSHKeys = sshkeys.New(c.Store)
	s.Webhooks = webhooks.New(webhooks.Options{Store: c.Store, Config: cfg.Webhooks, Audit: c.Audit, Log: log})
	return s
}

// agentSandboxes is what an agent session needs: the engine's validated
// sandbox and file operations, and the manager's lookup and exec.
type agentSandboxes struct {
	Engine
	m *sandbox.Manager
}

func (a agentSandboxes) Get(ctx context.Context, id string) (*sandbox.Info, error) {
	return a.m.Get(ctx, id)
}

func (a agentSandboxes) Exec(ctx context.Context, id string, spec sandbox.ExecSpec, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	return a.m.Exec(ctx, id, spec, onOutput)
}

// records are the pipeline's run records, as an agent session keeps its
// own.
type records struct{ p *pipeline.Service }

func (r records) New() (*runs.Record, error) { return r.p.NewRecord() }

func (r records) ContainerInfo(info *sandbox.Info, ephemeral bool) map[string]any {
	return pipeline.ContainerInfo(info, ephemeral)
}

func (r records) Finish(ctx context.Context, rec *runs.Record, m *runs.Metadata) error {
	return r.p.FinishRecord(ctx, rec, m)
}

// fixAgents is the agent service as the autofix provider "agent" uses it.
type fixAgents struct {
	a     *agents.Service
	creds agents.Credentials
}

func (f fixAgents) Ready() bool { return f.creds.AgentCredential() }

func (f fixAgents) Run(ctx context.Context, req apitypes.AgentRunRequest, progress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error) {
	return f.a.Run(ctx, req, progress)
}
