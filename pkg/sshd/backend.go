package sshd

import (
	"context"
	"io"
	"net"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Backend is what the SSH endpoint needs of the engine; *engine.Engine
// provides it (FromEngine). Every path into a sandbox is one the other
// front ends use: OpenProcess (the agent's PTY and pipe jobs), the file
// operations, Exec (for the SFTP commands the agent has no operation for:
// mkdir, rename, chmod), and DialPort (the agent's connect).
type Backend interface {
	// KeyOwner is whom a registered public key logs in as.
	KeyOwner(ctx context.Context, pub ssh.PublicKey) (principal.Principal, error)
	// RedeemToken spends a single-use token for a login to sandboxID.
	RedeemToken(tok, sandboxID string, root bool) (principal.Principal, error)
	// Access says why the principal on ctx cannot log in to sandbox id.
	Access(ctx context.Context, id string) error

	OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (Process, error)
	KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error)
	Exec(ctx context.Context, req apitypes.ExecRequest) (*apitypes.ExecResult, error)

	StatFile(ctx context.Context, id, path string) (*apitypes.FileEntry, error)
	ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error)
	ReadFileRaw(ctx context.Context, req apitypes.FileReadRequest) (*agent.FileData, error)
	WriteFileFrom(ctx context.Context, id, path, mode string, appendTo bool, size int64, r io.Reader) (*apitypes.FileResult, error)
	DeleteFile(ctx context.Context, id, path string, recursive bool) (*apitypes.FileResult, error)

	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
	// SubscribeEvents streams sandbox id's state changes until ctx ends.
	SubscribeEvents(ctx context.Context, id string) <-chan apitypes.Event
}

// Process is a command started by OpenProcess.
type Process interface {
	JobID() string
	// Chunks delivers output (stdout, stderr; stdout only on a terminal)
	// and is closed when the command ends.
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

func (b engineBackend) KeyOwner(ctx context.Context, pub ssh.PublicKey) (principal.Principal, error) {
	return b.SSHKeyOwner(ctx, pub)
}

func (b engineBackend) RedeemToken(tok, id string, root bool) (principal.Principal, error) {
	return b.SSHRedeemToken(tok, id, root)
}

func (b engineBackend) Access(ctx context.Context, id string) error { return b.SSHAccess(ctx, id) }

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

func (b engineBackend) SubscribeEvents(ctx context.Context, id string) <-chan apitypes.Event {
	return b.Engine.SubscribeEvents(ctx, id)
}

type terminal struct{ *sandbox.Terminal }

func (t terminal) JobID() string { return t.Terminal.JobID }
