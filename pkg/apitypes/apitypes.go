// Package apitypes defines the JSON objects of SandboxRunner's external
// contract (SPEC.md): sandboxes, command results, jobs, events, health. The
// engine produces them, the REST API and the MCP tools serve them, and the Go
// client (which must build without cgo, so cannot import the engine) decodes
// them — one definition for all, so the wire format cannot drift.
//
// The package is a leaf: it imports nothing of this repository.
package apitypes

import "time"

// State is a sandbox's lifecycle state (SPEC.md "Sandbox states").
type State string

// The states. running means at least one command is executing.
const (
	StateCreating   State = "creating"
	StateReady      State = "ready"
	StateRunning    State = "running"
	StateTerminated State = "terminated"
	StateFailed     State = "failed"
)

// Live reports whether s is a state in which the sandbox holds resources.
func (s State) Live() bool { return s == StateCreating || s == StateReady || s == StateRunning }

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool {
	switch s {
	case StateCreating, StateReady, StateRunning, StateTerminated, StateFailed:
		return true
	}
	return false
}

// Limits are a sandbox's resource limits.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	Pids        int64   `json:"pids"`
	DiskBytes   int64   `json:"disk_bytes"`
}

// CreateSandboxRequest is the input of sandbox_create (POST /v1/sandboxes).
// Nil pointers and empty strings take the configured defaults.
type CreateSandboxRequest struct {
	Language   string            `json:"language,omitempty"`
	Image      string            `json:"image,omitempty"`
	MemoryMB   *int64            `json:"memory_mb,omitempty"`
	CPUs       *float64          `json:"cpus,omitempty"`
	Pids       *int64            `json:"pids,omitempty"`
	DiskMB     *int64            `json:"disk_mb,omitempty"`
	Network    string            `json:"network,omitempty"` // none | egress | allowlist
	Allow      []string          `json:"allow,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	TTLSeconds *int64            `json:"ttl_seconds,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// SeccompProfile names a profile of the daemon's seccomp_dir ("default",
	// "strict"); empty takes the configured sandbox.seccomp_profile.
	SeccompProfile string `json:"seccomp_profile,omitempty"`
	// RequestID makes the create idempotent: a create with the request id
	// of an earlier one returns that sandbox (whatever its state now)
	// instead of starting another, so a client may retry after a timeout.
	RequestID string `json:"request_id,omitempty"`
}

// Sandbox describes a sandbox, live or not.
type Sandbox struct {
	ID          string `json:"sandbox_id"`
	State       State  `json:"state"`
	Language    string `json:"language"`
	Image       string `json:"image"`
	ImageDigest string `json:"image_digest,omitempty"`
	Limits      Limits `json:"limits"`
	Network     string `json:"network"`
	// SeccompProfile is the profile the sandbox runs under.
	SeccompProfile string            `json:"seccomp_profile,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	CgroupPath     string            `json:"cgroup_path,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
	LastActiveAt   time.Time         `json:"last_active_at"`
	ExpiresAt      *time.Time        `json:"expires_at,omitempty"`
	TerminatedAt   *time.Time        `json:"terminated_at,omitempty"`
	Reason         string            `json:"termination_reason,omitempty"`
}

// Usage is a live sandbox's resource usage as the kernel accounts it.
type Usage struct {
	MemoryBytes     uint64  `json:"memory_bytes"`
	MemoryMaxBytes  uint64  `json:"memory_max_bytes,omitempty"` // high-water mark (cgroup v1)
	CPUSeconds      float64 `json:"cpu_seconds"`
	Pids            uint64  `json:"pids"` // tasks: processes and threads
	OOMKills        uint64  `json:"oom_kills"`
	CPUThrottledSec float64 `json:"cpu_throttled_seconds,omitempty"`
	DiskBytes       int64   `json:"disk_bytes"`
}

// SandboxDetail is a sandbox with its live usage (sandbox_get).
type SandboxDetail struct {
	Sandbox
	Usage *Usage `json:"usage,omitempty"`
}

// Termination causes (SPEC.md "Termination causes").
const (
	CauseExited      = "exited"
	CauseTimeout     = "timeout"
	CauseOOM         = "oom"
	CauseOutputLimit = "output_limit"
	CauseSignal      = "signal"
	CauseKilled      = "killed"
	CauseLost        = "lost"
)

// Termination says how a command ended.
type Termination struct {
	Cause    string `json:"cause"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// ExecResult is the outcome of a command.
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
	// Usage is what the command and every process it started used, as
	// its own cgroup accounted it; absent when the backend cannot tell.
	Usage *JobUsage `json:"usage,omitempty"`
	// BlockedSyscalls are the syscalls the sandbox's seccomp profile
	// refused the command, with how often; absent when none were.
	BlockedSyscalls []BlockedSyscall `json:"blocked_syscalls,omitempty"`
}

// BlockedSyscall is a syscall seccomp refused and how many times.
type BlockedSyscall struct {
	Name  string `json:"name"`
	Count uint64 `json:"count"`
}

// JobUsage is one command's resource usage.
type JobUsage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryPeakBytes uint64  `json:"memory_peak_bytes,omitempty"`
}

// JobStatus is a background job's state and its output since given offsets.
type JobStatus struct {
	JobID            string       `json:"job_id"`
	State            string       `json:"state"` // running | finished
	Stdout           string       `json:"stdout"`
	Stderr           string       `json:"stderr"`
	StdoutOffset     int64        `json:"stdout_offset"`
	StderrOffset     int64        `json:"stderr_offset"`
	NextStdoutOffset int64        `json:"next_stdout_offset"`
	NextStderrOffset int64        `json:"next_stderr_offset"`
	ExitCode         *int         `json:"exit_code,omitempty"`
	Termination      *Termination `json:"termination,omitempty"`
	DurationMS       int64        `json:"duration_ms,omitempty"`
}

// Event is a state change or a piece of command output (/v1/events).
type Event struct {
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"` // "state", "output" or "dropped"
	SandboxID string    `json:"sandbox_id,omitempty"`
	From      string    `json:"from,omitempty"`
	To        string    `json:"to,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	JobID     string    `json:"job_id,omitempty"`
	Stream    string    `json:"stream,omitempty"`
	Data      string    `json:"data,omitempty"`
	Dropped   int       `json:"dropped,omitempty"` // events this subscriber missed (type "dropped")
}

// Check is one readiness check (/readyz).
type Check struct {
	Name     string `json:"name"`
	Status   string `json:"status"` // ok | degraded | failed
	Reason   string `json:"reason,omitempty"`
	Required bool   `json:"required"`
}

// Check statuses.
const (
	CheckOK       = "ok"
	CheckDegraded = "degraded"
	CheckFailed   = "failed"
)

// Status is the daemon's summary (sandboxctl status, /v1/status).
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

// GCReport lists what reconciliation or garbage collection did.
type GCReport struct {
	Adopted    []string `json:"adopted,omitempty"`    // live sandboxes taken over from an earlier daemon
	Terminated []string `json:"terminated,omitempty"` // recorded live, found dead
	Removed    []string `json:"removed,omitempty"`    // leftovers that belonged to no live sandbox
	Errors     []string `json:"errors,omitempty"`
}

// Artifact is a tar.gz of a sandbox directory kept by the daemon
// (files_export), downloadable at /v1/artifacts/{id}.
type Artifact struct {
	ID        string    `json:"artifact_id"`
	SandboxID string    `json:"sandbox_id"`
	Path      string    `json:"path"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	CreatedAt time.Time `json:"created_at"`
}
