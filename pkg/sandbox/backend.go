package sandbox

import (
	"context"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
)

// Backend is the seam between the lifecycle (state machine, pool, reaper,
// events — the Manager) and the machine a sandbox runs in. The container
// backend (pkg/sandbox/container) runs a libcontainer container; the VM
// backend (pkg/sandbox/qemu) runs a QEMU guest. Where it can, a backend runs
// the same agent (pkg/agent/server) inside, reached through Handle.Dial, so
// commands, files and terminals work the same whatever runs them; a guest
// that cannot run it (an administrator's disk) is reached through its own
// guest agent instead (GuestOps). Each backend and each live handle says
// what it can do (Capabilities): the Manager checks the handle's before
// every operation and refuses the others with unavailable, naming the
// sandbox and the missing capability.
//
// A backend records every resource it acquires in the sandbox's ledger
// before acquiring it and registers a releaser for each kind; the Manager
// releases a sandbox by walking its ledger (see pkg/ledger). Stopping is
// therefore not a backend call: the releaser of the backend's process kind
// (a container, a QEMU process) kills it.
type Backend interface {
	// Name is the backend's name in the API ("container", "vm").
	Name() string
	// Capabilities is the most any handle of this backend can do.
	Capabilities() Capabilities
	// Start acquires what the sandbox needs and starts it, recording each
	// resource with rec first. The agent may not answer yet when Start
	// returns. On error, what was recorded is released by the caller.
	Start(ctx context.Context, req StartRequest, rec ledger.Recorder) (Handle, error)
	// Adopt re-attaches to a sandbox an earlier daemon started, given what
	// its ledger holds and the identity recorded when it became ready. It
	// fails when the sandbox is gone or is not the one recorded.
	Adopt(ctx context.Context, req AdoptRequest) (Handle, error)
	// Scan lists, by sandbox id, the resources of this backend that exist on
	// the host whether recorded or not: garbage collection releases those of
	// ids that are not live.
	Scan(ctx context.Context) (map[string][]ledger.Resource, error)
}

// StartRequest is what a backend starts a sandbox from.
type StartRequest struct {
	ID    string
	Spec  Spec
	Image *image.Image
	// NetNSPath is the network namespace to join; empty gives the sandbox
	// a new one with only loopback.
	NetNSPath string
	// ResolvConf, if not nil, is the sandbox's /etc/resolv.conf.
	ResolvConf []byte
}

// AdoptRequest identifies a sandbox to re-attach to after a restart.
type AdoptRequest struct {
	ID        string
	Spec      Spec
	Resources []ledger.Resource
	Identity  Identity
}

// Identity pins a running sandbox's main process, against PID reuse.
type Identity struct {
	PID       int
	StartTime uint64 // /proc/PID/stat starttime
}

// Handle is a started or adopted sandbox.
type Handle interface {
	// Capabilities is what this sandbox can do (see Capability); the
	// Manager asks before every operation.
	Capabilities() Capabilities
	// Done is closed when the sandbox's main process (container init, QEMU)
	// has exited.
	Done() <-chan struct{}
	// ExitDescription says how it ended, once Done is closed ("" if unknown).
	ExitDescription() string
	// Dial opens a new connection to the sandbox's agent.
	Dial(ctx context.Context) (net.Conn, error)
	// Identity is what Adopt checks after a restart.
	Identity() Identity
	// CgroupPath is the cgroup holding the sandbox's processes.
	CgroupPath() string
	// Usage reads the sandbox's resource usage.
	Usage(ctx context.Context) (*Usage, error)
	// OOMKills counts the OOM killer's kills in the sandbox so far.
	OOMKills() (uint64, error)
}

// ExitNotifier is a Handle that calls back when its main process exits,
// so that the Manager needs no goroutine of its own parked on Done for
// each live sandbox (the container backend: its inits' exits are watched
// by one goroutine for all; docs/ARCHITECTURE.md, "Where an idle
// sandbox's memory goes"). Handles without it are watched through Done.
type ExitNotifier interface {
	// OnExit runs f, in a goroutine of its own, once Done is closed (at
	// once if it is).
	OnExit(f func())
}

// Agentless is a Handle whose sandbox runs no sandbox agent: a VM booting
// an administrator's disk (Windows, a Linux disk of one's own), whose guest
// runs only the QEMU guest agent. The Manager then waits for WaitReady
// instead of pinging an agent, at start and when it adopts the sandbox after
// a daemon restart. What it can do is its Capabilities (commands and files
// through GuestOps, when it is one); the lifecycle, ledger and cleanup are
// those of any sandbox.
type Agentless interface {
	// NoAgent says why the sandbox has no agent and what reaches it
	// instead; refusals of agent operations carry it.
	NoAgent() string
	// WaitReady returns once the sandbox is ready (its guest agent
	// answers), or an error; it bounds its own wait (the backend's boot
	// timeout) as well as by ctx, and returns when the sandbox's process
	// exits first.
	WaitReady(ctx context.Context) error
}

// Pauser is a Handle that can freeze and thaw every process of its sandbox
// (the container backend through the cgroup freezer; a VM backend would
// stop and continue its vCPUs). Pause and Resume are idempotent.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Paused reports whether the sandbox is frozen now.
	Paused() (bool, error)
}

// Network gives a sandbox whose network mode is not "none" its network
// namespace before the backend starts it: the namespace, its links and
// addresses and firewall entries, each recorded with rec before it is
// acquired (released through the ledger like everything else).
type Network interface {
	Attach(ctx context.Context, id string, spec Spec, rec ledger.Recorder) (NetworkAttachment, error)
}

// NetworkAttachment is what a sandbox's network gives the backend.
type NetworkAttachment struct {
	NetNSPath  string // the namespace to join
	ResolvConf []byte // the sandbox's /etc/resolv.conf
	// Env is added to every command's environment (Spec.NetEnv).
	Env map[string]string
}

// SyscallReporter is implemented by handles that count the syscalls their
// seccomp profile refused each job (see pkg/seccomp/diagnose.go).
type SyscallReporter interface {
	// BlockedSyscalls returns and forgets job's counts by syscall name.
	BlockedSyscalls(jobID string) map[string]uint64
}
