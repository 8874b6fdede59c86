package e2b

import (
	"context"
	"io"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Backend is what the E2B front end needs of the engine; *engine.Engine
// provides it (FromEngine), tests give a fake.
type Backend interface {
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error)
	GetSandbox(ctx context.Context, id string) (*apitypes.SandboxDetail, error)
	// ListSandboxes lists sandboxes in state ("" live ones).
	ListSandboxes(ctx context.Context, state string) ([]*apitypes.Sandbox, error)
	TerminateSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	PauseSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error)
	SetSandboxTimeout(ctx context.Context, id string, seconds int64) (*apitypes.Sandbox, error)
	ImageList(ctx context.Context) (*apitypes.ImageList, error)
	// ListTemplates lists the daemon's templates: E2B's templateID names
	// one of them, or an image.
	ListTemplates(ctx context.Context) (*apitypes.TemplateList, error)

	// Exec runs a command to its end (the file operations envd has and
	// the agent has not: stat with owners, mkdir, rename, watching).
	Exec(ctx context.Context, req apitypes.ExecRequest) (*apitypes.ExecResult, error)
	// OpenProcess starts a command the caller follows (envd's processes).
	OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (Process, error)
	// AttachProcess follows a command OpenProcess started, output from
	// the given offsets: after a daemon restart the agent still runs it.
	AttachProcess(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64) (Process, error)
	KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error)
	ListJobs(ctx context.Context, id string) ([]apitypes.JobInfo, error)

	WriteFileFrom(ctx context.Context, id, path, mode string, appendTo bool, size int64, r io.Reader) (*apitypes.FileResult, error)
	ReadFileRaw(ctx context.Context, req apitypes.FileReadRequest) (*agent.FileData, error)
	DeleteFile(ctx context.Context, id, path string, recursive bool) (*apitypes.FileResult, error)

	// ExposePort and DialExposed relay a sandbox port (getHost).
	ExposePort(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error)
	DialExposed(ctx context.Context, id string, port int) (net.Conn, error)
}

// Process is a running command started by OpenProcess.
type Process interface {
	// JobID is the agent's id of the command.
	JobID() string
	// Chunks delivers output (stream stdout, stderr; stdout on a
	// terminal) until the command ends.
	Chunks() <-chan agent.Chunk
	Write(p []byte) (int, error)
	CloseStdin() error
	Resize(rows, cols uint16) error
	// Wait returns the outcome once Chunks is drained.
	Wait() (*apitypes.ExecResult, error)
	// Close detaches, killing the command if it still runs.
	Close() error
}

// FromEngine adapts the engine to Backend; every call is the engine's own.
func FromEngine(e *engine.Engine) Backend { return engineBackend{e} }

type engineBackend struct{ *engine.Engine }

func (b engineBackend) Exec(ctx context.Context, req apitypes.ExecRequest) (*apitypes.ExecResult, error) {
	return b.Engine.Exec(ctx, req, nil)
}

func (b engineBackend) OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (Process, error) {
	t, err := b.Engine.OpenProcess(ctx, req)
	if err != nil {
		return nil, err
	}
	return terminal{t}, nil
}

func (b engineBackend) AttachProcess(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64) (Process, error) {
	t, err := b.Engine.AttachProcess(ctx, id, jobID, stdoutOff, stderrOff)
	if err != nil {
		return nil, err
	}
	return terminal{t}, nil
}

type terminal struct{ *sandbox.Terminal }

func (t terminal) JobID() string { return t.Terminal.JobID }
