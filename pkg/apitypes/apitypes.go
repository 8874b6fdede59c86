// Package apitypes defines the JSON objects of SandboxRunner's external
// contract (docs/SPEC.md): sandboxes, command results, jobs, events, health. The
// engine produces them, the REST API and the MCP tools serve them, and the Go
// client (which must build without cgo, so cannot import the engine) decodes
// them — one definition for all, so the wire format cannot drift.
//
// The package is a leaf: it imports nothing of this repository.
package apitypes

import "time"

// State is a sandbox's lifecycle state (docs/SPEC.md "Sandbox states").
type State string

// The states. running means at least one command is executing.
const (
	StateCreating State = "creating"
	StateReady    State = "ready"
	StateRunning  State = "running"
	// StatePaused: every process of the sandbox is frozen (cgroup freezer)
	// until sandbox_resume; it holds its resources but uses no CPU.
	StatePaused     State = "paused"
	StateTerminated State = "terminated"
	StateFailed     State = "failed"
	// StateUnavailable is a gateway's word (pkg/gateway) for a sandbox
	// whose node does not answer: last seen live there, neither lost nor
	// reachable until the node is back. Nodes never report it.
	StateUnavailable State = "unavailable"
)

// Live reports whether s is a state in which the sandbox holds resources.
func (s State) Live() bool {
	return s == StateCreating || s == StateReady || s == StateRunning || s == StatePaused
}

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool {
	switch s {
	case StateCreating, StateReady, StateRunning, StatePaused, StateTerminated, StateFailed:
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
	// NetworkBandwidth is bytes per second in each direction, and
	// NetworkConnRate new connections per second, of a sandbox with
	// network; 0: unlimited.
	NetworkBandwidth int64 `json:"network_bandwidth,omitempty"`
	NetworkConnRate  int64 `json:"network_conn_rate,omitempty"`
	// Inodes is how many files and directories the sandbox's file system
	// holds at most.
	Inodes int64 `json:"inodes,omitempty"`
}

// CreateSandboxRequest is the input of sandbox_create (POST /v1/sandboxes).
// Nil pointers and empty strings take the configured defaults.
type CreateSandboxRequest struct {
	// Backend is what runs the sandbox: "container" (the default) or "vm"
	// (a QEMU guest: its own kernel; OS picks the guest).
	Backend string `json:"backend,omitempty" jsonschema_description:"container (default) or vm: a QEMU VM with its own kernel, slower to start, no network." jsonschema:"enum=container,enum=vm"`
	// OS is a VM's guest OS: linux (default) or windows.
	OS       string   `json:"os,omitempty" jsonschema_description:"With backend vm: linux (default) or windows (the administrator's disk, via qemu-ga only)." jsonschema:"enum=linux,enum=windows"`
	Language string   `json:"language,omitempty" jsonschema_description:"Language of the sandbox (see languages_list), e.g. python, c, node. Picks the image of the same name (with backend vm: the language's guest image)."`
	Image    string   `json:"image,omitempty" jsonschema_description:"Image to use instead of the language's own (rarely needed). With backend vm: linux (the Linux test guest, the default) or a language made into a guest."`
	MemoryMB *int64   `json:"memory_mb,omitempty" jsonschema_description:"Memory limit in MiB (no swap). Default from the server configuration."`
	CPUs     *float64 `json:"cpus,omitempty" jsonschema_description:"CPU limit in cores, e.g. 0.5 or 2."`
	Pids     *int64   `json:"pids,omitempty" jsonschema_description:"Maximum number of processes and threads."`
	DiskMB   *int64   `json:"disk_mb,omitempty" jsonschema_description:"Size of the writable layer in MiB."`
	// Inodes limits the files and directories of the writable file system
	// (nil: one per 16 KiB of disk).
	Inodes *int64 `json:"inodes,omitempty" jsonschema_description:"Maximum number of files and directories (default one per 16 KiB of disk)."`
	// DiskBacking is where the writable file system lives: "disk" (an
	// ext4 image; does not count against memory) or "memory" (a tmpfs:
	// fastest, but every byte written counts against the memory limit).
	// Empty: the configured default.
	DiskBacking string   `json:"disk_backing,omitempty" jsonschema_description:"disk (default; an ext4 image) or memory (a tmpfs: faster, but counts against the memory limit)." jsonschema:"enum=disk,enum=memory"`
	Network     string   `json:"network,omitempty" jsonschema_description:"Network mode: none (default; no network at all), egress or allowlist." jsonschema:"enum=none,enum=egress,enum=allowlist"` // none | egress | allowlist
	Allow       []string `json:"allow,omitempty" jsonschema_description:"With network allowlist: host names, *.domain wildcards, IPv4 CIDRs and @preset names (server configuration) that are reachable; other names do not resolve."`
	// NetworkBandwidth and NetworkConnRate limit a sandbox with network.
	NetworkBandwidth *int64            `json:"network_bandwidth,omitempty" jsonschema_description:"With network egress or allowlist: bandwidth in bytes per second, each direction. Default and maximum from the server configuration."`
	NetworkConnRate  *int64            `json:"network_conn_rate,omitempty" jsonschema_description:"With network egress or allowlist: new connections per second. Default and maximum from the server configuration."`
	Env              map[string]string `json:"env,omitempty" jsonschema_description:"Environment variables of every command in the sandbox."`
	// Credentials are granted through the credential proxy on the
	// gateway; the sandbox never holds their secrets.
	Credentials []string          `json:"credentials,omitempty" jsonschema_description:"With network egress or allowlist: upstream API credentials (network.credentials) to use through the daemon's proxy; the sandbox never sees the secret."`
	TTLSeconds  *int64            `json:"ttl_seconds,omitempty" jsonschema_description:"Terminate the sandbox after this many seconds whatever it is doing."`
	Labels      map[string]string `json:"labels,omitempty" jsonschema_description:"Free-form labels to find the sandbox by."`
	// SeccompProfile names a profile of the daemon's seccomp_dir ("default",
	// "strict"); empty takes the configured sandbox.seccomp_profile.
	SeccompProfile string `json:"seccomp_profile,omitempty" jsonschema_description:"default (Docker's) or strict (also no ptrace, io_uring, bpf, namespaces, ...)."`
	// RequestID makes the create idempotent: a create with the request id
	// of an earlier one returns that sandbox (whatever its state now)
	// instead of starting another, so a client may retry after a timeout.
	RequestID string `json:"request_id,omitempty" jsonschema_description:"Client request id: a create with the id of an earlier one returns that sandbox instead of starting another (safe retries)."`
	// FromSnapshot starts the sandbox from a workspace snapshot (a fork):
	// its files, on its own disk, in the snapshot's language.
	FromSnapshot string `json:"from_snapshot,omitempty" jsonschema_description:"Snapshot id: start with that snapshot's files on a disk of its own (a fork)."`
	// Root runs commands and file operations as uid 0 inside the sandbox's
	// own user namespace (an unprivileged uid on the host).
	Root bool `json:"root,omitempty" jsonschema_description:"Run commands as root inside the sandbox (e.g. apt-get); an unprivileged uid on the host."`
	// RootAsUser (with Root; the E2B front end) keeps the root-mode
	// sandbox's writable root and capabilities but runs commands and file
	// operations as the sandbox user unless a command asks for uid 0.
	RootAsUser bool `json:"-"`
	// PauseOnExpiry (the E2B front end's autoPause) pauses the sandbox
	// when ttl_seconds pass instead of terminating it; the configured max
	// lifetime still terminates it.
	PauseOnExpiry bool `json:"-"`
	// ImageDigest (run replay) pins the sandbox to that stored build of
	// its image, current or not; a client cannot set it.
	ImageDigest string `json:"-"`
	// Template names a template (template_create): its image, limits,
	// network and environment are the defaults, and the sandbox comes back
	// with the template's start command already ready.
	Template string `json:"template,omitempty" jsonschema_description:"Template (template_list) to start from; its start command is ready on return."`
	// Volumes are named volumes mounted into the sandbox.
	Volumes []VolumeMount `json:"volumes,omitempty" jsonschema_description:"Named volumes (volume_create) to mount; their files outlive the sandbox and are shared."`
}

// Sandbox describes a sandbox, live or not.
type Sandbox struct {
	ID string `json:"sandbox_id"`
	// Tenant owns the sandbox: the tenant of the API key that created it
	// ("" for sandboxes made on the unix socket or before tenants).
	Tenant      string   `json:"tenant,omitempty"`
	State       State    `json:"state"`
	Language    string   `json:"language"`
	Image       string   `json:"image"`
	ImageDigest string   `json:"image_digest,omitempty"`
	Limits      Limits   `json:"limits"`
	DiskBacking string   `json:"disk_backing,omitempty"`
	Network     string   `json:"network"`
	Allow       []string `json:"allow,omitempty"`
	Credentials []string `json:"credentials,omitempty"`
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
	// Backend is what runs the sandbox: "vm" for a QEMU guest, empty for
	// a container.
	Backend string `json:"backend,omitempty"`
	// FromSnapshot is the snapshot a fork started from.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Volumes are the named volumes mounted into it.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Template is the template it was made from.
	Template string `json:"template,omitempty"`
	// Capabilities are what a live sandbox can do (exec, jobs, pty, files,
	// file_list, ports, file_snapshot, memory_snapshot, screenshot,
	// pause); an operation it cannot do answers unavailable naming it.
	Capabilities []string `json:"capabilities,omitempty"`
	// VM is what only a VM has (backend vm).
	VM *VMInfo `json:"vm,omitempty"`
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
	Inodes          int64   `json:"inodes_used,omitempty"`
}

// SandboxDetail is a sandbox with its live usage (sandbox_get).
type SandboxDetail struct {
	Sandbox
	Usage *Usage `json:"usage,omitempty"`
	// NetworkStatus is the policy and counters of a live sandbox with
	// network.
	NetworkStatus *NetworkStatus `json:"network_status,omitempty"`
	// CredentialUsage is what a live sandbox did through the credential
	// proxy, by credential name.
	CredentialUsage map[string]CredentialUsage `json:"credential_usage,omitempty"`
}

// CredentialUsage counts a sandbox's requests through the credential
// proxy for one credential.
type CredentialUsage struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Refused counts requests the spend cap refused; CapReached names the
	// cap (max_requests, max_tokens).
	Refused    int64  `json:"refused"`
	CapReached string `json:"cap_reached,omitempty"`
}

// Termination causes (docs/SPEC.md "Termination causes").
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
	// More is set when output past the next offsets is already there: call
	// again with the next offsets without waiting.
	More bool `json:"more"`
}

// Event is a state change or a piece of command output (/v1/events).
type Event struct {
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"` // "state", "output", "fix_attempt" or "dropped"
	SandboxID string    `json:"sandbox_id,omitempty"`
	// Tenant owns the sandbox; a non-admin subscriber sees only its own.
	Tenant  string `json:"tenant,omitempty"`
	From    string `json:"from,omitempty"`
	To      string `json:"to,omitempty"`
	Reason  string `json:"reason,omitempty"`
	JobID   string `json:"job_id,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Data    string `json:"data,omitempty"`
	Dropped int    `json:"dropped,omitempty"` // events this subscriber missed (type "dropped")
	// Autofix is an autofix loop's attempt, fix or result (type "fix_attempt").
	Autofix *AutofixEvent `json:"autofix,omitempty"`
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
	Version string  `json:"version"`
	Commit  string  `json:"commit"`
	UptimeS float64 `json:"uptime_s"`
	Cgroups string  `json:"cgroups"`
	Seccomp bool    `json:"seccomp"`
	// Landlock is whether container sandboxes started now are confined
	// by Landlock; LandlockABI the kernel's ABI version (0: none).
	Landlock     bool           `json:"landlock"`
	LandlockABI  int            `json:"landlock_abi"`
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
	ID        string `json:"artifact_id"`
	SandboxID string `json:"sandbox_id"`
	// Tenant owns the archive: its sandbox's tenant. Another tenant's
	// download is not_found, as for an id that does not exist.
	Tenant    string    `json:"tenant,omitempty"`
	Path      string    `json:"path"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	CreatedAt time.Time `json:"created_at"`
	// DownloadPath is where REST serves the archive: /v1/artifacts/{id}.
	DownloadPath string `json:"download_path,omitempty"`
}

// SandboxNetworkRequest is the input of sandbox_network
// (PUT /v1/sandboxes/{id}/network): a new mode and/or allowlist for a
// running sandbox created with network; neither reports the current ones.
type SandboxNetworkRequest struct {
	SandboxID string   `json:"sandbox_id" jsonschema_description:"The sandbox."`
	Mode      string   `json:"mode,omitempty" jsonschema_description:"egress or allowlist (a sandbox created with network none keeps it)." jsonschema:"enum=egress,enum=allowlist"`
	Allow     []string `json:"allow,omitempty" jsonschema_description:"With mode allowlist: host names, *.domain wildcards, IPv4 CIDRs and @preset names."`
}

// NetworkStatus is a sandbox's network policy and connection counters.
type NetworkStatus struct {
	Mode     string          `json:"mode"`
	Allow    []string        `json:"allow"`
	Counters NetworkCounters `json:"counters"`
}

// NetworkRefusals is what an allowlist sandbox was refused during one MCP
// call: the host names its DNS lookups were refused, the ones the client
// approved through elicitation (now allowed), and the allowlist that
// would have let the call through (learning an allowlist from a run).
type NetworkRefusals struct {
	Refused       []string `json:"refused"`
	Approved      []string `json:"approved,omitempty"`
	ProposedAllow []string `json:"proposed_allow"`
}

// NetworkCounters count a sandbox's connection attempts.
type NetworkCounters struct {
	Allowed            uint64   `json:"allowed"`
	Denied             uint64   `json:"denied"`
	DeniedDestinations []string `json:"denied_destinations"` // recent denied addresses and refused names, bounded
}

// NodeStatus is a node daemon's capacity and usage as its gateways place
// creates by it (GET /v1/node, admin only).
type NodeStatus struct {
	// Name is the node's node.name (empty for a lone daemon).
	Name string `json:"name"`
	// Ready is the daemon's readiness (GET /readyz).
	Ready bool `json:"ready"`
	// Draining nodes take no new sandboxes (PUT /v1/node/drain).
	Draining bool `json:"draining"`
	// Live counts the sandboxes that hold resources (creating, ready,
	// running, paused); MaxSandboxes is sandbox.max_sandboxes.
	Live         int `json:"live"`
	MaxSandboxes int `json:"max_sandboxes"`
	// MemoryBytes and CPUs are the machine's; the committed figures sum the
	// limits of the live sandboxes.
	MemoryBytes          int64   `json:"memory_bytes"`
	MemoryCommittedBytes int64   `json:"memory_committed_bytes"`
	CPUs                 float64 `json:"cpus"`
	CPUsCommitted        float64 `json:"cpus_committed"`
	// Images are the names of the built images a sandbox may start from.
	Images []string `json:"images"`
	// VM says whether the node offers backend vm.
	VM bool `json:"vm"`
	// Defaults are the limits a create that names none gets here
	// (sandbox.memory, cpus, disk): what a gateway counts against a
	// key's fleet quota for it.
	Defaults Limits `json:"defaults"`
	// E2BPort and PreviewPort are the ports of this node's E2B listener
	// (e2b.listen) and preview listener (server.preview_listen), 0 when
	// off: a gateway reaches them on the node's host.
	E2BPort     int `json:"e2b_port,omitempty"`
	PreviewPort int `json:"preview_port,omitempty"`
}

// NodeDrainRequest is the body of PUT /v1/node/drain.
type NodeDrainRequest struct {
	Draining bool `json:"draining"`
}

// FleetNode is one node in a gateway's GET /v1/nodes.
type FleetNode struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// Reachable is false when the node did not answer its probe (Error
	// says why); Status is then absent.
	Reachable bool        `json:"reachable"`
	Error     string      `json:"error,omitempty"`
	Status    *NodeStatus `json:"status,omitempty"`
}

// FleetNodeList is a gateway's GET /v1/nodes.
type FleetNodeList struct {
	Nodes []FleetNode `json:"nodes"`
}
