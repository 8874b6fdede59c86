package client

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// The types below are the REST API's JSON, as clients see it. The daemon
// encodes the engine's own types (pkg/engine, pkg/sandbox), which cannot be
// imported here because they link libcontainer (cgo) and sandboxctl is a
// static binary; pkg/api's tests check that both sides produce the same JSON.

// ErrorBody is the error object of every failed request.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorResponse is the body of every failed request: {"error": {...}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status  string  `json:"status"`
	Version string  `json:"version"`
	UptimeS float64 `json:"uptime_s"`
}

// Check is one readiness check.
type Check struct {
	Name     string `json:"name"`
	Status   string `json:"status"` // ok | degraded | failed
	Reason   string `json:"reason,omitempty"`
	Required bool   `json:"required"`
}

// Readiness is the body of GET /readyz (status 200 or 503).
type Readiness struct {
	Status string  `json:"status"` // ready | not_ready
	Checks []Check `json:"checks"`
}

// Readiness statuses.
const (
	StatusReady    = "ready"
	StatusNotReady = "not_ready"
)

// Status is the body of GET /v1/status.
type Status struct {
	Version      string         `json:"version"`
	Commit       string         `json:"commit"`
	UptimeS      float64        `json:"uptime_s"`
	Cgroups      string         `json:"cgroups"`
	Seccomp      bool           `json:"seccomp"`
	Ready        bool           `json:"ready"`
	Sandboxes    map[string]int `json:"sandboxes"`
	MaxSandboxes int            `json:"max_sandboxes"`
	Checks       []Check        `json:"checks"`
}

// Limits are a sandbox's resource limits.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	Pids        int64   `json:"pids"`
	DiskBytes   int64   `json:"disk_bytes"`
}

// Sandbox describes a sandbox.
type Sandbox struct {
	ID           string            `json:"sandbox_id"`
	State        string            `json:"state"`
	Language     string            `json:"language"`
	Image        string            `json:"image"`
	ImageDigest  string            `json:"image_digest,omitempty"`
	Limits       Limits            `json:"limits"`
	Network      string            `json:"network"`
	Env          map[string]string `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	CgroupPath   string            `json:"cgroup_path,omitempty"`
	CreatedAt    time.Time         `json:"created_at"`
	UpdatedAt    time.Time         `json:"updated_at"`
	LastActiveAt time.Time         `json:"last_active_at"`
	ExpiresAt    *time.Time        `json:"expires_at,omitempty"`
	TerminatedAt *time.Time        `json:"terminated_at,omitempty"`
	Reason       string            `json:"termination_reason,omitempty"`
}

// Usage is a live sandbox's resource usage.
type Usage struct {
	MemoryBytes     uint64  `json:"memory_bytes"`
	MemoryMaxBytes  uint64  `json:"memory_max_bytes,omitempty"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	Pids            uint64  `json:"pids"`
	OOMKills        uint64  `json:"oom_kills"`
	CPUThrottledSec float64 `json:"cpu_throttled_seconds,omitempty"`
	DiskBytes       int64   `json:"disk_bytes"`
}

// SandboxDetail is a sandbox with its live usage (GET /v1/sandboxes/{id}).
type SandboxDetail struct {
	Sandbox
	Usage *Usage `json:"usage,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. Nil pointers take
// the daemon's defaults.
type CreateSandboxRequest struct {
	Language   string            `json:"language,omitempty"`
	Image      string            `json:"image,omitempty"`
	MemoryMB   *int64            `json:"memory_mb,omitempty"`
	CPUs       *float64          `json:"cpus,omitempty"`
	Pids       *int64            `json:"pids,omitempty"`
	DiskMB     *int64            `json:"disk_mb,omitempty"`
	Network    string            `json:"network,omitempty"`
	Allow      []string          `json:"allow,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	TTLSeconds *int64            `json:"ttl_seconds,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Give Command (run
// with /bin/sh -c) or Argv.
type ExecRequest struct {
	Command        string            `json:"command,omitempty"`
	Argv           []string          `json:"argv,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty"`
}

// Termination says how a command ended (SPEC.md "Termination causes").
type Termination struct {
	Cause    string `json:"cause"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// ExecResult is the outcome of a command. Over REST the output arrives as
// stream lines first; Client.Exec collects it into Stdout and Stderr.
type ExecResult struct {
	JobID           string      `json:"job_id,omitempty"`
	ExitCode        int         `json:"exit_code"`
	Stdout          string      `json:"stdout"`
	Stderr          string      `json:"stderr"`
	StdoutTruncated bool        `json:"stdout_truncated"`
	StderrTruncated bool        `json:"stderr_truncated"`
	StdoutBytes     int64       `json:"stdout_bytes"`
	StderrBytes     int64       `json:"stderr_bytes"`
	DurationMS      int64       `json:"duration_ms"`
	Termination     Termination `json:"termination"`
}

// ExecLine is one line of the exec NDJSON stream: output (Stream and Data),
// the final outcome (Exit, whose stdout and stderr are empty because the
// output came in the stream lines) or an error that ended the stream.
type ExecLine struct {
	Stream string `json:"stream,omitempty"` // stdout | stderr
	Data   string `json:"data,omitempty"`
	// Encoding is "base64" when the output chunk is not valid UTF-8 and Data
	// holds it base64-encoded; empty otherwise.
	Encoding string      `json:"encoding,omitempty"`
	Exit     *ExecResult `json:"exit,omitempty"`
	Error    *ErrorBody  `json:"error,omitempty"`
}

// EncodingBase64 marks base64-encoded data in stream lines.
const EncodingBase64 = "base64"

// decoded returns a stream line's output bytes.
func (l *ExecLine) decoded() ([]byte, error) {
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
type FileEntry = agent.FileInfo

// FileResult is the outcome of a file upload or deletion.
type FileResult struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

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
type TerminalRequest struct {
	Command string
	Argv    []string
	Env     map[string]string
	Cwd     string
	Rows    uint16
	Cols    uint16
}

// TerminalMessage is a JSON text message on the terminal WebSocket: "resize"
// from the client, "exit" from the server as its last message.
type TerminalMessage struct {
	Type        string       `json:"type"`
	Rows        uint16       `json:"rows,omitempty"`
	Cols        uint16       `json:"cols,omitempty"`
	ExitCode    *int         `json:"exit_code,omitempty"`
	Termination *Termination `json:"termination,omitempty"`
	// Error is set on an exit message when the daemon lost the terminal.
	Error *ErrorBody `json:"error,omitempty"`
}

// Terminal message types.
const (
	TerminalResize = "resize"
	TerminalExit   = "exit"
)

// Event is a sandbox state change or a piece of command output
// (GET /v1/events).
type Event struct {
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"` // state | output | dropped
	SandboxID string    `json:"sandbox_id,omitempty"`
	From      string    `json:"from,omitempty"`
	To        string    `json:"to,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	JobID     string    `json:"job_id,omitempty"`
	Stream    string    `json:"stream,omitempty"`
	Data      string    `json:"data,omitempty"`
	Dropped   int       `json:"dropped,omitempty"`
}

// Image is a built language image.
type Image struct {
	Name         string            `json:"name"`
	Digest       string            `json:"digest"`
	BuiltAt      time.Time         `json:"built_at"`
	SizeBytes    int64             `json:"size_bytes"`
	BuildSeconds float64           `json:"build_seconds"`
	Suite        string            `json:"suite"`
	Mirror       string            `json:"mirror"`
	Packages     map[string]string `json:"packages,omitempty"`
}

// GCReport lists what garbage collection removed and what it could not.
type GCReport struct {
	Adopted    []string `json:"adopted,omitempty"`
	Terminated []string `json:"terminated,omitempty"`
	Removed    []string `json:"removed,omitempty"`
	Errors     []string `json:"errors,omitempty"`
}
