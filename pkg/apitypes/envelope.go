package apitypes

import (
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The envelope: the error object, the list and state answers, and every
// stream event (NDJSON lines, WebSocket messages) that the front ends serve.
// Each is declared here once; pkg/api encodes them, pkg/mcpserver uses them
// as its tools' output types (their output schemas are generated from
// them), pkg/api/client decodes them and cmd/tsgen writes them out as the
// web editor's TypeScript types (web/src/apitypes.gen.ts).

// ErrorBody is the error object (docs/SPEC.md "Errors"): a taxonomy code
// and a client-safe message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBodyOf is err's error object: its code and its client-safe message
// (errdefs.MessageOf: "internal error" for an error of no known class).
func ErrorBodyOf(err error) ErrorBody {
	return ErrorBody{Code: string(errdefs.CodeOf(err)), Message: errdefs.MessageOf(err)}
}

// Err is the error the body describes, with its taxonomy code.
func (b *ErrorBody) Err() error {
	return &errdefs.Error{Code: errdefs.Code(b.Code), Message: b.Message}
}

// ErrorResponse is a failed request's body on REST and the text of an MCP
// tool result with isError: {"error": {...}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// CommandResult is a command's outcome as exec_command, run_task and
// packages_install answer it: every field of ExecResult, exit_code and
// termination absent while a background job runs (state running), and a
// note saying where output cut to fit the answer went.
type CommandResult struct {
	JobID           string       `json:"job_id,omitempty"`
	State           string       `json:"state"` // finished | running
	ExitCode        *int         `json:"exit_code,omitempty"`
	Stdout          string       `json:"stdout"`
	Stderr          string       `json:"stderr"`
	StdoutTruncated bool         `json:"stdout_truncated"`
	StderrTruncated bool         `json:"stderr_truncated"`
	StdoutBytes     int64        `json:"stdout_bytes"`
	StderrBytes     int64        `json:"stderr_bytes"`
	DurationMS      int64        `json:"duration_ms"`
	Termination     *Termination `json:"termination,omitempty"`
	// Usage and BlockedSyscalls: see ExecResult.
	Usage           *JobUsage        `json:"usage,omitempty"`
	BlockedSyscalls []BlockedSyscall `json:"blocked_syscalls,omitempty"`
	// Note says where cut output went, when it was cut.
	Note string `json:"note,omitempty"`
	// NetworkRefusals lists the hosts an allowlist sandbox was refused
	// during this call (MCP only).
	NetworkRefusals *NetworkRefusals `json:"network_refusals,omitempty"`
}

// Job states.
const (
	JobRunning  = "running"
	JobFinished = "finished"
)

// FinishedCommand is res as a CommandResult: every field carried over.
// A synchronous command's job is gone once it finished, so there is no
// job_id.
func FinishedCommand(res *ExecResult) CommandResult {
	code, term := res.ExitCode, res.Termination
	return CommandResult{State: JobFinished, ExitCode: &code, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes, DurationMS: res.DurationMS,
		Termination: &term, Usage: res.Usage, BlockedSyscalls: res.BlockedSyscalls}
}

// JobStarted answers a command started in the background: its job id
// (REST POST /v1/sandboxes/{id}/jobs).
type JobStarted struct {
	JobID string `json:"job_id"`
}

// JobList is a sandbox's jobs (GET /v1/sandboxes/{id}/jobs).
type JobList struct {
	Jobs []JobInfo `json:"jobs"`
}

// SandboxList is sandbox_list (GET /v1/sandboxes): the sandboxes, how many
// there are, and whether the list was cut to fit an answer.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	Total     int       `json:"total"`
	Truncated bool      `json:"truncated,omitempty"`
}

// SandboxState is the answer of a state change (sandbox_terminate,
// sandbox_pause, sandbox_resume, sandbox_restore over MCP).
type SandboxState struct {
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
}

// LanguageList is languages_list (GET /v1/languages).
type LanguageList struct {
	Languages []LanguageInfo `json:"languages"`
}

// FileListRequest is the input of file_list (GET
// /v1/sandboxes/{id}/files?list=true).
type FileListRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Path      string `json:"path,omitempty" jsonschema_description:"Absolute path of a directory; default /workspace."`
	Recursive bool   `json:"recursive,omitempty" jsonschema_description:"List the whole tree under path."`
	// MaxEntries caps the entries returned (0: DefaultListEntries); Total
	// and Truncated say what was left out.
	MaxEntries int `json:"max_entries,omitempty" jsonschema_description:"Most entries to return (default 10000); total and truncated say when there are more."`
}

// DefaultListEntries is how many entries a listing returns when the
// request names no max_entries.
const DefaultListEntries = 10_000

// FileList is a directory listing: the entries, how many the directory
// (or tree) holds, and whether the entries stop short of that.
type FileList struct {
	Entries []FileEntry `json:"entries"`
	Total   int         `json:"total"`
	// Truncated is set when Entries holds fewer than Total: cut at
	// max_entries, or to fit a tool result.
	Truncated bool `json:"truncated,omitempty"`
}

// RunList is run_list (GET /v1/runs).
type RunList struct {
	Runs      []RunMetadata `json:"runs"`
	Truncated bool          `json:"truncated,omitempty"`
}

// SnapshotList is snapshot_list (GET /v1/snapshots).
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SnapshotDeleteResult is snapshot_delete's answer (REST answers 204).
type SnapshotDeleteResult struct {
	SnapshotID string `json:"snapshot_id"`
	Deleted    bool   `json:"deleted"`
}

// PortList is a sandbox's exposures (GET /v1/sandboxes/{id}/ports).
type PortList struct {
	Ports []PortExposure `json:"ports"`
}

// Health is GET /healthz.
type Health struct {
	Status  string  `json:"status"`
	Version string  `json:"version"`
	UptimeS float64 `json:"uptime_s"`
}

// Readiness is GET /readyz (status 200 or 503).
type Readiness struct {
	Status string  `json:"status"` // ready | not_ready
	Checks []Check `json:"checks"`
}

// Readiness statuses.
const (
	StatusReady    = "ready"
	StatusNotReady = "not_ready"
)

// SystemInfo is GET /v1/system: what this daemon offers, so that clients
// (the web editor's AutoFix button) adapt to it at run time.
type SystemInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Features name optional API parts and whether this daemon serves them.
	Features map[string]bool `json:"features"`
}

// EncodingBase64 marks base64-encoded data in stream lines and file reads.
const EncodingBase64 = "base64"

// ExecLine is one line of the exec NDJSON stream (POST
// /v1/sandboxes/{id}/exec, POST /v1/run?stream=true): output (Stream and
// Data), then the outcome (Exit, whose stdout and stderr are empty: the
// output went out in the lines before; Result for a run), or an error
// that ended the stream.
type ExecLine struct {
	Stream string `json:"stream,omitempty"` // stdout | stderr
	Data   string `json:"data,omitempty"`
	// Encoding is "base64" when the output chunk is not valid UTF-8 and
	// Data holds it base64-encoded; empty otherwise.
	Encoding string    `json:"encoding,omitempty"`
	Exit     *ExecExit `json:"exit,omitempty"`
	// Result ends a streamed run_code.
	Result *RunResult `json:"result,omitempty"`
	Error  *ErrorBody `json:"error,omitempty"`
}

// ExecExit is the outcome line of an exec stream: the ExecResult without
// its output, which went out in the lines before — the empty members below
// shadow the embedded ones, so that the line has no stdout or stderr at all.
type ExecExit struct {
	*ExecResult
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
}

// NewExecExit is res as an exit line.
func NewExecExit(res *ExecResult) *ExecExit { return &ExecExit{ExecResult: res} }

// CreateLine is one line of the create stream (POST
// /v1/sandboxes?stream=true): a progress line of a slow start (a VM's guest
// image built on its first use, a disk guest booting), then the sandbox, or
// the error that ended the create.
type CreateLine struct {
	Log     string     `json:"log,omitempty"`
	Sandbox *Sandbox   `json:"sandbox,omitempty"`
	Error   *ErrorBody `json:"error,omitempty"`
}

// LoginURL is a one-time web editor login (POST /v1/ui/login-tokens): the
// URL that redeems it, its token and when it expires.
type LoginURL struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// BuildLine is one line of the image build stream (POST
// /v1/images/{name}/build): a line of the build log, then the built image,
// or the error that ended the build.
type BuildLine struct {
	Log   string     `json:"log,omitempty"`
	Image *Image     `json:"image,omitempty"`
	Error *ErrorBody `json:"error,omitempty"`
}

// ImageLine is one line of an image pull or import stream (POST
// /v1/images/pull, POST /v1/images/import): a progress event, then the
// image, or the error that ended it.
type ImageLine struct {
	Progress *ImageProgress `json:"progress,omitempty"`
	Image    *Image         `json:"image,omitempty"`
	Error    *ErrorBody     `json:"error,omitempty"`
}

// AgentLine is one line of the agent_run stream (POST
// /v1/agent/run?stream=true): a progress event, the result, or the error
// that ended the session.
type AgentLine struct {
	Progress *AgentProgress  `json:"progress,omitempty"`
	Result   *AgentRunResult `json:"result,omitempty"`
	Error    *ErrorBody      `json:"error,omitempty"`
}

// AutofixLine is one line of the /v1/autofix NDJSON stream: an attempt or
// a fix as it happens (type attempt, fix), then the loop's answer (type
// result) or the error that ended it (type error).
type AutofixLine struct {
	AutofixEvent
	Error *ErrorBody `json:"error,omitempty"`
}

// TerminalMessage is a JSON text message on the terminal WebSocket (GET
// /v1/sandboxes/{id}/terminal): "resize" from the client, "exit" from the
// server as its last message.
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

// ProgressMessage is the params of an MCP progress notification a tool
// call sends (output, heartbeats, autofix and agent events): progress
// counts notifications, so it increases with each one as the protocol
// requires.
type ProgressMessage struct {
	ProgressToken any    `json:"progressToken"`
	Progress      int    `json:"progress"`
	Message       string `json:"message"`
}

// Params is m as the notification's params object (the MCP library takes
// a map).
func (m ProgressMessage) Params() map[string]any {
	return map[string]any{"progressToken": m.ProgressToken, "progress": m.Progress, "message": m.Message}
}
