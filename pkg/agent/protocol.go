// Package agent is the client side of the sandbox-agent protocol and the
// wire types shared with the agent itself (cmd/sandbox-agent).
//
// The agent runs as PID 1 inside every sandbox and listens on a unix socket
// whose directory is bind-mounted from the host. The protocol carries one
// request per connection, so that a daemon restart never loses state: every
// job lives in the agent, and a new connection can re-attach to it.
//
// # Wire format
//
// Every message in either direction is a header line, a single JSON object
// terminated by '\n' and at most MaxLineBytes long, optionally followed by
// exactly Len raw bytes of payload (stdin, output, file content). Large data
// therefore never travels base64-encoded inside JSON.
//
// The client sends one Request header (plus its payload). The agent answers
// with a sequence of Frames: zero or more "output" or "entry" frames, then a
// final "result", "exit" or "error" frame, and closes the connection. An
// "interactive" request additionally lets the client send "stdin",
// "close_stdin" and "resize" frames while output frames flow back, which is
// the shape of a WebSocket terminal bridge.
//
// Everything the agent says is untrusted: the client bounds every line and
// payload, validates fields and honours context deadlines on every call.
package agent

import (
	"time"
)

// ProtocolVersion is carried in the "v" field of every request and frame.
// The agent refuses requests of another version and the client refuses
// frames of another version.
const ProtocolVersion = 1

// PidsReserve is how many tasks a sandbox's cgroup allows beyond its
// commands' pids limit, for the agent's own threads and the helpers it
// forks: the commands share a cgroup limited to theirs (the agent's
// --jobs-pids), so a fork bomb cannot leave the agent unable to start a
// thread, which kills a Go program. Idle, the agent has 6 threads; each
// helper it forks (jobexec.c, before Go's runtime) is one task until it
// joins its job's cgroup.
const PidsReserve = 32

// Bounds of the protocol. Both sides enforce them.
const (
	// MaxLineBytes bounds one JSON header line, including argv and env of an
	// exec request.
	MaxLineBytes = 1 << 20
	// MaxChunkBytes bounds the payload of one output or stdin frame.
	MaxChunkBytes = 256 << 10
	// MaxReadBytes bounds the data per stream returned by one Read call.
	MaxReadBytes = 4 << 20
	// MaxTransferBytes bounds one file read or write.
	MaxTransferBytes = 256 << 20
	// MaxStdinBytes bounds the stdin payload of an exec request.
	MaxStdinBytes = 64 << 20
	// MaxListEntries bounds the entries one file listing sends (its Max);
	// the agent counts the entries past it without sending them.
	MaxListEntries = 100_000
	// DefaultReadFileMax is used by ReadFile when max is not positive.
	DefaultReadFileMax = 16 << 20
)

// Request operations.
const (
	OpPing        = "ping"
	OpStart       = "start"
	OpAttach      = "attach"
	OpRead        = "read"
	OpSignal      = "signal"
	OpJobs        = "jobs"
	OpForget      = "forget"
	OpInteractive = "interactive"
	OpReadFile    = "read_file"
	OpWriteFile   = "write_file"
	OpListFiles   = "list_files"
	OpDeleteFile  = "delete_file"
	OpStat        = "stat"
	// OpConnect opens a TCP connection to Request.Port on the sandbox's
	// loopback; after the result frame the connection carries raw bytes
	// both ways (see connect.go).
	OpConnect = "connect"
)

// Frame types.
const (
	// FrameResult ends a successful request; it carries the op's result.
	FrameResult = "result"
	// FrameError ends a failed request; it carries Error.
	FrameError = "error"
	// FrameOutput carries Len bytes of Stream starting at Offset.
	FrameOutput = "output"
	// FrameExit ends an attach or interactive stream with the job's Exit.
	FrameExit = "exit"
	// FrameEntry carries one element (File or Job) of a listing.
	FrameEntry = "entry"
	// FrameStdin (client to agent) carries Len bytes for the job's stdin.
	FrameStdin = "stdin"
	// FrameCloseStdin (client to agent) closes the job's stdin.
	FrameCloseStdin = "close_stdin"
	// FrameResize (client to agent) sets the terminal size to Rows x Cols.
	FrameResize = "resize"
)

// Stream names.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// Termination causes of a finished job.
const (
	CauseExited      = "exited"
	CauseSignal      = "signal"
	CauseTimeout     = "timeout"
	CauseOutputLimit = "output_limit"
	CauseKilled      = "killed"
)

// Job states.
const (
	StateRunning  = "running"
	StateFinished = "finished"
)

// File types reported in FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// Request is the header line a client sends to open a connection's single
// request. Only the fields the Op uses are set.
type Request struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	// Len is the number of raw payload bytes following the header: stdin
	// for OpStart, file content for OpWriteFile.
	Len int64 `json:"len,omitempty"`

	JobID        string       `json:"job_id,omitempty"`
	Exec         *ExecRequest `json:"exec,omitempty"`
	StdoutOffset int64        `json:"stdout_offset,omitempty"`
	StderrOffset int64        `json:"stderr_offset,omitempty"`
	// Max bounds what OpRead and OpReadFile return, in bytes. For
	// OpListFiles it is the most entries to send (1 to MaxListEntries):
	// the agent counts the rest and says so in the result (ListResult).
	// Without it (0) a listing is whole or, past MaxListEntries, refused
	// with limit_exceeded: what a daemon that predates counted listings
	// expects, and what a caller that needs every entry wants.
	Max       int64             `json:"max,omitempty"`
	Signal    string            `json:"signal,omitempty"`
	Path      string            `json:"path,omitempty"`
	Offset    int64             `json:"offset,omitempty"`
	Recursive bool              `json:"recursive,omitempty"`
	Write     *WriteFileRequest `json:"write,omitempty"`
	// Port is the TCP port of an OpConnect request.
	Port int `json:"port,omitempty"`
	// Follow (OpStart only) keeps the connection after the result frame:
	// the agent streams the job's output and exit on it as an OpAttach
	// from offset 0 would, then forgets the job (OpForget) once the exit
	// frame is sent, or keeps it for a later attach if the client went
	// away first. A whole exec on one connection instead of three. An
	// agent that predates it ignores the field and closes after the
	// result; the client then attaches and forgets on connections of
	// their own (Client.Run).
	Follow bool `json:"follow,omitempty"`
}

// Frame is one header line of a response (agent to client) or of the input
// side of an interactive session (client to agent).
type Frame struct {
	V    int    `json:"v"`
	Type string `json:"type"`
	// Len is the number of raw payload bytes following the header.
	Len int64 `json:"len,omitempty"`

	Error  *Error      `json:"error,omitempty"`
	Stream string      `json:"stream,omitempty"`
	Offset int64       `json:"offset,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
	JobID  string      `json:"job_id,omitempty"`
	Info   *Info       `json:"info,omitempty"`
	Job    *JobInfo    `json:"job,omitempty"`
	File   *FileInfo   `json:"file,omitempty"`
	Read   *ReadResult `json:"read,omitempty"`
	Data   *FileData   `json:"data,omitempty"`
	List   *ListResult `json:"list,omitempty"`
	Rows   uint16      `json:"rows,omitempty"`
	Cols   uint16      `json:"cols,omitempty"`
}

// TTYSize is the size of a pseudo-terminal in character cells.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// HoldGrace bounds how long ExecRequest.HoldOutput waits for an attach.
const HoldGrace = 30 * time.Second

// ExecRequest describes a command to start.
type ExecRequest struct {
	// Argv is the command line; Argv[0] is absolute or looked up in the
	// PATH of Env.
	Argv []string `json:"argv"`
	// Env is the environment as "K=V"; empty means the agent's default
	// (PATH, HOME=/home/sandbox, LANG).
	Env []string `json:"env,omitempty"`
	// Cwd is the absolute working directory; empty means /workspace if it
	// exists, else /.
	Cwd string `json:"cwd,omitempty"`
	// UID and GID default to the agent's --uid and --gid. UID 0 must be
	// requested explicitly.
	UID *int `json:"uid,omitempty"`
	GID *int `json:"gid,omitempty"`
	// Stdin is written to the command's stdin, which is then closed (unless
	// OpenStdin). Nil or empty means /dev/null. It travels as raw payload.
	Stdin []byte `json:"-"`
	// OpenStdin keeps a non-TTY command's stdin open for an Interactive
	// session to write to and close.
	OpenStdin bool `json:"open_stdin,omitempty"`
	// TimeoutMS kills the command's process group after this many
	// milliseconds; 0 means no timeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// HoldOutput keeps every byte of output from the start until the
	// first attach (or for HoldGrace at most), holding the program back
	// like an attached reader would: the daemon is about to attach, and a
	// fast program must not push its first bytes out of the retained tail
	// before it does.
	HoldOutput bool `json:"hold_output,omitempty"`
	// OutputLimit is the maximum number of bytes per stream; exceeding it
	// kills the command. 0 means unlimited.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// TTY, when set, runs the command on a pseudo-terminal of that size:
	// all output arrives on stdout and there is no stderr.
	TTY *TTYSize `json:"tty,omitempty"`
}

// Chunk is a piece of a job's output. Offset is the absolute position of
// Data[0] in the stream; when it is greater than the offset asked for, the
// bytes in between were no longer retained by the agent.
type Chunk struct {
	Stream string
	Offset int64
	Data   []byte
}

// ExitStatus is the outcome of a finished job.
type ExitStatus struct {
	// Cause is one of the Cause constants.
	Cause string `json:"cause"`
	// ExitCode is the exit status, or 128+n when killed by signal n.
	ExitCode int `json:"exit_code"`
	// Signal is the name of the terminating signal, like "SIGKILL".
	Signal      string    `json:"signal,omitempty"`
	Detail      string    `json:"detail,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	FinishedAt  time.Time `json:"finished_at"`
	DurationMS  int64     `json:"duration_ms"`
	StdoutBytes int64     `json:"stdout_bytes"`
	StderrBytes int64     `json:"stderr_bytes"`
	// CPUSeconds and MemoryPeakBytes are the job's usage as its own cgroup
	// accounts it (every process it started); zero when the agent has no
	// per-job cgroups or the hierarchy does not count it.
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"`
	MemoryPeakBytes uint64  `json:"memory_peak_bytes,omitempty"`
	// OOMKills counts the job's processes the OOM killer ended.
	OOMKills uint64 `json:"oom_kills,omitempty"`
}

// Info describes the agent process.
type Info struct {
	Version  string    `json:"version"`
	Protocol int       `json:"protocol"`
	PID      int       `json:"pid"`
	Started  time.Time `json:"started"`
	UptimeMS int64     `json:"uptime_ms"`
	Jobs     int       `json:"jobs"`
	Running  int       `json:"running"`
}

// JobInfo describes a job known to the agent.
type JobInfo struct {
	ID          string      `json:"id"`
	Argv        []string    `json:"argv"`
	PID         int         `json:"pid"`
	State       string      `json:"state"`
	TTY         bool        `json:"tty,omitempty"`
	StartedAt   time.Time   `json:"started_at"`
	StdoutBytes int64       `json:"stdout_bytes"`
	StderrBytes int64       `json:"stderr_bytes"`
	Exit        *ExitStatus `json:"exit,omitempty"`
}

// ReadResult is a non-blocking snapshot of a job's output after given
// offsets. On the wire the data follows the header as StdoutLen bytes of
// stdout then StderrLen bytes of stderr.
type ReadResult struct {
	State string `json:"state"`
	// StdoutOffset and StderrOffset are the offsets of the first returned
	// byte; greater than requested when older output was not retained.
	StdoutOffset int64 `json:"stdout_offset"`
	StderrOffset int64 `json:"stderr_offset"`
	StdoutLen    int   `json:"stdout_len"`
	StderrLen    int   `json:"stderr_len"`
	// Stdout and Stderr are the returned data.
	Stdout []byte `json:"-"`
	Stderr []byte `json:"-"`
	// NextStdoutOffset and NextStderrOffset are where the next Read starts.
	NextStdoutOffset int64 `json:"next_stdout_offset"`
	NextStderrOffset int64 `json:"next_stderr_offset"`
	// Exit is set once the job has finished.
	Exit *ExitStatus `json:"exit,omitempty"`
}

// FileInfo describes a file in the sandbox.
type FileInfo struct {
	Path string `json:"path"`
	// Type is one of the Type constants.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode holds the permission bits (including setuid, setgid, sticky).
	Mode  uint32    `json:"mode"`
	MTime time.Time `json:"mtime"`
}

// FileData is the result of ReadFile.
type FileData struct {
	Path string `json:"path"`
	// Data holds the bytes read; on the wire it follows the header.
	Data []byte `json:"-"`
	// Size is the file's total size.
	Size int64 `json:"size"`
	// Truncated reports that the file continues after the returned data.
	Truncated bool `json:"truncated"`
}

// ListResult ends a list_files answer: how many entries the listing has,
// and whether the agent stopped sending them before the end (at the
// request's Max). An agent that predates counted listings ends it without
// one: it ignores Max, sends every entry up to MaxListEntries and fails
// past that.
type ListResult struct {
	Total     int  `json:"total"`
	Truncated bool `json:"truncated,omitempty"`
}

// FileList is a listing cut at a maximum (Client.ListFilesMax).
type FileList struct {
	// Entries are the listing's first entries, at most the maximum asked
	// for.
	Entries []FileInfo
	// Total is how many entries the listing has.
	Total int
	// Truncated is set when Entries holds fewer than Total.
	Truncated bool
}

// WriteFileRequest describes a file write; the content travels separately.
type WriteFileRequest struct {
	Path string `json:"path"`
	// Mode is the permission bits; 0 means 0644.
	Mode uint32 `json:"mode,omitempty"`
	// Append appends instead of replacing the content.
	Append bool `json:"append,omitempty"`
	// MkdirParents creates missing parent directories.
	MkdirParents bool `json:"mkdir_parents,omitempty"`
	// Size is the exact number of content bytes; WriteFile fills it in when
	// the content's length is known.
	Size int64 `json:"size"`
}
