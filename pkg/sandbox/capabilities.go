package sandbox

import (
	"context"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Capability is one kind of operation a sandbox's handle may be able to do
// (after Nomad's plugins/drivers Capabilities: a driver says what it can do
// and the scheduler asks before it calls, so that an operation a backend
// cannot do is refused cleanly instead of failing half-way). Its string is
// what clients see in refusals and in a sandbox's description.
type Capability string

// The capabilities. Exec and Files are served by our agent or by a guest
// agent (GuestAgent); the others by our agent only or by the backend.
const (
	CapExec           Capability = "exec"            // run a command and wait for it
	CapJobs           Capability = "jobs"            // background jobs: start, page, signal, list
	CapPTY            Capability = "pty"             // commands on a pseudo-terminal
	CapFiles          Capability = "files"           // read and write a file
	CapFileList       Capability = "file_list"       // list and delete files, exports
	CapPorts          Capability = "ports"           // reach a port on the sandbox's loopback
	CapFileSnapshot   Capability = "file_snapshot"   // workspace snapshots, restore, fork
	CapMemorySnapshot Capability = "memory_snapshot" // whole-machine snapshots (RAM, devices, disk)
	CapScreenshot     Capability = "screenshot"      // a picture of the sandbox's screen
	CapPause          Capability = "pause"           // freeze and thaw every process
)

// Capabilities says what a backend, or one live handle of it, can do.
// A backend's are the most any of its handles can; a handle's are what
// that sandbox can (a VM booting an administrator's disk has no agent).
type Capabilities struct {
	// Agent: our agent (pkg/agent/server) runs inside and answers on
	// Handle.Dial: exec, jobs, PTY, files, listing and ports.
	Agent bool
	// GuestAgent: a guest's own agent (the QEMU guest agent) runs inside
	// instead, and the handle is a GuestOps: exec and files only.
	GuestAgent bool
	// FileSnapshot: the handle is a WritableState and a Pauser, whose
	// writable state the daemon archives and replaces.
	FileSnapshot bool
	// MemorySnapshot: the handle is a MachineSnapshotter.
	MemorySnapshot bool
	// Screenshot: the handle is a Screenshotter.
	Screenshot bool
	// Pause: the handle is a Pauser clients may pause and resume.
	Pause bool
}

// Has reports whether c includes capability want.
func (c Capabilities) Has(want Capability) bool {
	switch want {
	case CapExec, CapFiles:
		return c.Agent || c.GuestAgent
	case CapJobs, CapPTY, CapFileList, CapPorts:
		return c.Agent
	case CapFileSnapshot:
		return c.FileSnapshot
	case CapMemorySnapshot:
		return c.MemorySnapshot
	case CapScreenshot:
		return c.Screenshot
	case CapPause:
		return c.Pause
	}
	return false
}

// allCapabilities is every capability, in the order List gives them.
var allCapabilities = []Capability{CapExec, CapJobs, CapPTY, CapFiles, CapFileList, CapPorts,
	CapFileSnapshot, CapMemorySnapshot, CapScreenshot, CapPause}

// List is c as the names of the capabilities it has.
func (c Capabilities) List() []string {
	out := []string{}
	for _, k := range allCapabilities {
		if c.Has(k) {
			out = append(out, string(k))
		}
	}
	return out
}

// GuestOps is a Handle whose commands and files go through a guest agent of
// the guest's own (Capabilities.GuestAgent) rather than ours: the QEMU
// guest agent of a VM booting an administrator's disk. Inputs are checked
// by the engine as for any sandbox except for paths, whose form is the
// guest OS's (C:\... on Windows): the handle checks those, naming the field.
type GuestOps interface {
	// GuestExec runs spec (Command, when set, through the guest's own
	// shell) with env, the sandbox's and the request's variables merged,
	// cutting each stream of the result at limit bytes. The output comes
	// at the end, not as it arrives.
	GuestExec(ctx context.Context, spec ExecSpec, env []string, limit int64) (*ExecResult, error)
	// GuestWriteFile creates or truncates path with data (its parent made
	// when missing); mode, when not 0, is then set where the OS has modes.
	GuestWriteFile(ctx context.Context, path string, mode uint32, data []byte) (int64, error)
	// GuestReadFile reads at most max bytes at offset of path.
	GuestReadFile(ctx context.Context, path string, offset, max int64) (*agent.FileData, error)
	// GuestCheckPath checks a path of the guest (field names it in errors).
	GuestCheckPath(field, path string) error
}

// MachineSnapshotter is a Handle that saves and restores its whole machine
// (memory, devices, disk) under names: a VM's internal snapshots.
type MachineSnapshotter interface {
	SaveSnapshot(ctx context.Context, name string) error
	RestoreSnapshot(ctx context.Context, name string) error
	Snapshots(ctx context.Context) ([]string, error)
}

// Screenshotter is a Handle with a screen, which it returns as PNG.
type Screenshotter interface {
	Screenshot(ctx context.Context) ([]byte, error)
}

// Describer is a Handle that says what only its backend has (a VM's guest
// OS, accelerator and guest agent) for the sandbox's description.
type Describer interface {
	Describe(ctx context.Context) map[string]string
}

// missing is the refusal of an operation needing capability want on sb,
// whose handle has caps: unavailable, naming the sandbox, the capability
// and what the sandbox can do instead.
func (sb *Sandbox) missing(want Capability, caps Capabilities) error {
	why := ""
	if sb.handle != nil {
		if n, ok := sb.handle.(interface{ NoAgent() string }); ok {
			why = "; " + n.NoAgent()
		}
	}
	backend := sb.spec.Backend
	if backend == "" {
		backend = "container"
	}
	return errdefs.Unavailablef("sandbox %s (backend %s) lacks the %s capability (it has: %s)%s",
		sb.ID, backend, want, strings.Join(caps.List(), ", "), why)
}

// require returns sb's handle's capabilities, or the refusal when they lack
// want (or sb has no handle yet: it is still starting).
func (sb *Sandbox) require(want Capability) (Capabilities, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.handle == nil {
		return Capabilities{}, errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	caps := sb.handle.Capabilities()
	if !caps.Has(want) {
		return caps, sb.missing(want, caps)
	}
	return caps, nil
}

// Capabilities returns what live sandbox id can do now.
func (m *Manager) Capabilities(ctx context.Context, id string) (Capabilities, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return Capabilities{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.handle == nil {
		return Capabilities{}, errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	return sb.handle.Capabilities(), nil
}

// Describe returns what the handle of live sandbox id says of itself
// (Describer), or nil.
func (m *Manager) Describe(ctx context.Context, id string) map[string]string {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil
	}
	sb.mu.Lock()
	h := sb.handle
	sb.mu.Unlock()
	if d, ok := h.(Describer); ok {
		return d.Describe(ctx)
	}
	return nil
}

// handleFor returns live sandbox id's handle when it has capability want,
// for an operation of the backend's own (machine snapshots, screenshots):
// the sandbox must be ready, running or paused.
func (m *Manager) handleFor(ctx context.Context, id string, want Capability) (*Sandbox, Handle, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if _, err := sb.require(want); err != nil {
		return nil, nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.terminating || sb.state == StateCreating {
		return nil, nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	return sb, sb.handle, nil
}

// SaveMachineSnapshot saves live sandbox id's whole machine under name
// (CapMemorySnapshot); a snapshot of the same name is replaced.
func (m *Manager) SaveMachineSnapshot(ctx context.Context, id, name string) error {
	sb, h, err := m.handleFor(ctx, id, CapMemorySnapshot)
	if err != nil {
		return err
	}
	m.touch(sb)
	return h.(MachineSnapshotter).SaveSnapshot(ctx, name)
}

// RestoreMachineSnapshot returns live sandbox id's machine to snapshot
// name: files written and processes started since are gone.
func (m *Manager) RestoreMachineSnapshot(ctx context.Context, id, name string) error {
	sb, h, err := m.handleFor(ctx, id, CapMemorySnapshot)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	paused := sb.state == StatePaused
	sb.mu.Unlock()
	if paused {
		// The restored machine would run while recorded paused.
		return errdefs.Conflictf("sandbox_id: sandbox %s is paused; resume it before a restore", sb.ID)
	}
	m.touch(sb)
	return h.(MachineSnapshotter).RestoreSnapshot(ctx, name)
}

// MachineSnapshots lists the names of live sandbox id's machine snapshots.
func (m *Manager) MachineSnapshots(ctx context.Context, id string) ([]string, error) {
	_, h, err := m.handleFor(ctx, id, CapMemorySnapshot)
	if err != nil {
		return nil, err
	}
	return h.(MachineSnapshotter).Snapshots(ctx)
}

// Screenshot returns live sandbox id's screen as PNG (CapScreenshot).
func (m *Manager) Screenshot(ctx context.Context, id string) ([]byte, error) {
	_, h, err := m.handleFor(ctx, id, CapScreenshot)
	if err != nil {
		return nil, err
	}
	return h.(Screenshotter).Screenshot(ctx)
}

// Require fails unless live sandbox id's handle has capability want, with
// the refusal every operation needing it gets (for checks made before the
// operation, such as exposing a port).
func (m *Manager) Require(ctx context.Context, id string, want Capability) error {
	_, _, err := m.lookupFor(ctx, id, want)
	return err
}
