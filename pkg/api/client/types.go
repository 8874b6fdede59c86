package client

import (
	"encoding/base64"
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// The types below are the REST API's JSON, as clients see it. The daemon
// encodes the engine's own types (pkg/engine, pkg/sandbox), which cannot be
// imported here because they link libcontainer (cgo) and sandboxctl is a
// static binary; pkg/api's tests check that both sides produce the same JSON.

// ErrorBody is the error object of every failed request; its Err is the
// error it describes, with its taxonomy code.
type ErrorBody = apitypes.ErrorBody

// ErrorResponse is the body of every failed request: {"error": {...}}.
type ErrorResponse = apitypes.ErrorResponse

// Health is the body of GET /healthz.
type Health = apitypes.Health

// Check is one readiness check.
type Check = apitypes.Check

// Readiness is the body of GET /readyz (status 200 or 503).
type Readiness = apitypes.Readiness

// Readiness statuses.
const (
	StatusReady    = apitypes.StatusReady
	StatusNotReady = apitypes.StatusNotReady
)

// Status is the body of GET /v1/status.
type Status = apitypes.Status

// Limits are a sandbox's resource limits.
type Limits = apitypes.Limits

// Sandbox describes a sandbox.
type Sandbox = apitypes.Sandbox

// Usage is a live sandbox's resource usage.
type Usage = apitypes.Usage

// SandboxDetail is a sandbox with its live usage (GET /v1/sandboxes/{id}).
type SandboxDetail = apitypes.SandboxDetail

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest = apitypes.CreateSandboxRequest

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Give Command (run
// with /bin/sh -c) or Argv; the sandbox is the one in the path.
type ExecRequest = apitypes.ExecRequest

// Termination says how a command ended (docs/SPEC.md "Termination causes").
type Termination = apitypes.Termination

// ExecResult is the outcome of a command. Over REST the output arrives as
// stream lines first; Client.Exec collects it into Stdout and Stderr.
type ExecResult = apitypes.ExecResult

// ExecLine is one line of the exec NDJSON stream: output (Stream and Data),
// the final outcome (Exit, whose stdout and stderr are empty because the
// output came in the stream lines) or an error that ended the stream.
// A streamed run_code ends with Result instead of Exit.
type ExecLine = apitypes.ExecLine

// EncodingBase64 marks base64-encoded data in stream lines.
const EncodingBase64 = apitypes.EncodingBase64

// decoded returns a stream line's output bytes.
func decoded(l *ExecLine) ([]byte, error) {
	if l.Encoding == EncodingBase64 {
		b, err := base64.StdEncoding.DecodeString(l.Data)
		if err != nil {
			return nil, fmt.Errorf("%s line: invalid base64: %w", l.Stream, err)
		}
		return b, nil
	}
	return []byte(l.Data), nil
}

// FileEntry is one entry of a directory listing.
type FileEntry = apitypes.FileEntry

// FileResult is the outcome of a file upload or deletion.
type FileResult = apitypes.FileResult

// FileData describes a download: the file's total size and whether it goes
// on past the bytes returned (X-File-Size, X-File-Truncated).
type FileData struct {
	Size      int64
	Truncated bool
	// N is how many bytes were copied to the writer.
	N int64
}

// TerminalRequest opens an interactive command on a pseudo-terminal. Give
// Command (run with /bin/sh -c) or Argv, or neither for the default shell.
type TerminalRequest = apitypes.TerminalRequest

// TerminalMessage is a JSON text message on the terminal WebSocket: "resize"
// from the client, "exit" from the server as its last message.
type TerminalMessage = apitypes.TerminalMessage

// Terminal message types.
const (
	TerminalResize = apitypes.TerminalResize
	TerminalExit   = apitypes.TerminalExit
)

// Event is a sandbox state change or a piece of command output
// (GET /v1/events).
type Event = apitypes.Event

// Image is a built language image.
type Image = apitypes.Image

// GCReport lists what garbage collection removed and what it could not.
type GCReport = apitypes.GCReport

// SandboxNetworkRequest is the body of PUT /v1/sandboxes/{id}/network.
type SandboxNetworkRequest = apitypes.SandboxNetworkRequest

// NetworkStatus is a sandbox's network policy and counters.
type NetworkStatus = apitypes.NetworkStatus
