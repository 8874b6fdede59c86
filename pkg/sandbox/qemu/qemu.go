// Package qemu is the sandbox backend that runs each sandbox as a QEMU
// virtual machine (pkg/vm): the Linux test guest booted with the daemon's
// sandbox-agent, which serves the same protocol as in a container over a
// virtio-serial channel, so that commands, files and jobs work on a VM as
// on a container.
//
// What one sandbox holds, in acquisition order (each recorded in the ledger
// before it is acquired, released in reverse):
//
//	vm-cgroup  CgroupParent/vms/<id>: QEMU's cgroup with the VM's limits
//	vm         RunDir/vms/<id>: the QEMU process (pid + start time in
//	           vm.json), its overlay, sockets, console log and swtpm
//
// VM cgroups live under their own "vms" child of the cgroup parent, so that
// the container backend's scan (children named sb-*) never sees them.
//
// Fast start: with Options.FastStart the first sandbox of a guest and
// machine size boots a template VM, saves its ready snapshot and keeps it
// under GuestCache/templates; every sandbox then starts from that snapshot.
//
// The security boundaries (QEMU's seccomp, -runas, cgroup limits, no guest
// network) are written down in pkg/vm.
package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// Resource kinds of a VM sandbox.
const (
	KindCgroup = "vm-cgroup"
	KindVM     = "vm"
)

// Options configure the backend.
type Options struct {
	QEMU  string // default qemu-system-x86_64
	Accel string // auto (or empty), kvm, tcg
	// AgentPath is the static sandbox-agent put into every guest.
	AgentPath string
	// RunDir holds the VMs' state dirs (RunDir/vms/<id>); keep it short,
	// it is part of unix socket paths.
	RunDir string
	// GuestCache holds guests made from images and fast-start templates.
	GuestCache   string
	CgroupParent string
	// RunAs is the user QEMU drops to; empty keeps it root.
	RunAs     string
	FastStart bool
	// Profile resolves the profile of a guest OS (vm.ResolveProfile under
	// the configuration): the firmware and TPM of VMs booting an
	// administrator's disk (Spec.BootDisk). Nil: such VMs are refused.
	Profile func(os string) (*vm.Profile, error)
	// BootTimeout bounds how long such a VM may boot until its QEMU guest
	// agent answers (vm.boot_timeout); default 15 minutes.
	BootTimeout time.Duration
	Log         *slog.Logger
}

// Backend runs sandboxes as VMs.
type Backend struct {
	opt Options
	log *slog.Logger

	tmplMu sync.Mutex // one template boot at a time
}

var _ sandbox.Backend = (*Backend)(nil)

// New checks the options, prepares the directories and registers the
// backend's resource kinds with l.
func New(opt Options, l *ledger.Ledger) (*Backend, error) {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.QEMU == "" {
		opt.QEMU = vm.DefaultQEMU
	}
	switch opt.Accel {
	case "", "auto":
		opt.Accel = ""
	case vm.AccelKVM, vm.AccelTCG:
	default:
		return nil, errdefs.Invalidf("vm.accel: %q is not auto, kvm or tcg", opt.Accel)
	}
	if opt.BootTimeout <= 0 {
		opt.BootTimeout = 15 * time.Minute
	}
	if _, err := os.Stat(opt.AgentPath); err != nil {
		return nil, fmt.Errorf("sandbox agent binary: %w", err)
	}
	for _, d := range []string{filepath.Join(opt.RunDir, "vms"), filepath.Join(opt.GuestCache, "templates")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := cgroups.EnsureParent(opt.CgroupParent); err != nil {
		return nil, err
	}
	l.Register(KindVM, func(ctx context.Context, r ledger.Resource) error { return vm.Remove(ctx, r.Key) })
	l.Register(KindCgroup, func(_ context.Context, r ledger.Resource) error {
		if !cgroups.Exists(r.Key) {
			return nil
		}
		return cgroups.Remove(r.Key)
	})
	return &Backend{opt: opt, log: opt.Log}, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "vm" }

// agentCapabilities are those of a VM of our guests: the sandbox agent in
// the guest (exec, jobs, PTY, files, ports), the whole machine's snapshots,
// its screen, and pause (its vCPUs stopped). Workspace snapshots need the
// writable state on the host (a VM's is inside its disk).
var agentCapabilities = sandbox.Capabilities{Agent: true, MemorySnapshot: true, Screenshot: true, Pause: true}

// Capabilities implements sandbox.Backend: a VM of our guests can do the
// most (a disk guest's handle, qgaCapabilities, less).
func (b *Backend) Capabilities() sandbox.Capabilities { return agentCapabilities }

func (b *Backend) dir(id string) string { return filepath.Join(b.opt.RunDir, "vms", id) }

func (b *Backend) cgroupPath(id string) string {
	return filepath.Join(b.opt.CgroupParent, "vms", id)
}

// Start implements sandbox.Backend: cgroup, then the QEMU process.
// req.Image must be a VM guest image (one with a kernel and
// /sbin/sandbox-init, like rootfs/vm/vm-linux.yaml); it is made into a
// guest once (vm.PrepareGuest).
func (b *Backend) Start(ctx context.Context, req sandbox.StartRequest, rec ledger.Recorder) (sandbox.Handle, error) {
	if req.NetNSPath != "" {
		return nil, errdefs.Unavailablef("network: VM sandboxes have no network device yet; use network none")
	}
	if req.Spec.BootDisk != "" {
		return b.startDisk(ctx, req, rec)
	}
	guest, err := vm.PrepareGuest(ctx, req.Image, b.opt.AgentPath, b.opt.GuestCache)
	if err != nil {
		return nil, err
	}
	spec := b.spec(req.ID, guest, req.Spec.Limits)
	if b.opt.FastStart {
		tmpl, err := b.template(ctx, guest, spec)
		if err != nil {
			return nil, fmt.Errorf("fast-start template: %w", err)
		}
		spec.FromTemplate = tmpl
	}
	v, err := startRecorded(ctx, spec, rec)
	if err != nil {
		return nil, err
	}
	return &handle{v: v, cgroup: spec.Cgroup}, nil
}

// startDisk starts a VM that boots an administrator's disk
// (Spec.BootDisk, the guest's OS in Spec.Language) through its firmware:
// the OS's profile gives the firmware and TPM. There is no fast-start
// template for such disks: a template is a snapshot of the booted guest's
// RAM on the disk, a Windows guest's is gigabytes, and an administrator's
// disk changes under the daemon's feet (the template would silently
// resurrect the old one). The guest runs only qemu-ga: the handle is
// Agentless.
func (b *Backend) startDisk(ctx context.Context, req sandbox.StartRequest, rec ledger.Recorder) (sandbox.Handle, error) {
	if b.opt.Profile == nil {
		return nil, errdefs.Unavailablef("vm: this backend boots no administrator's disks")
	}
	osName := req.Spec.Language
	prof, err := b.opt.Profile(osName)
	if err != nil {
		return nil, err
	}
	spec := b.spec(req.ID, vm.DiskGuest(osName, req.Spec.BootDisk), req.Spec.Limits)
	spec.Firmware, spec.TPM = prof.Firmware, prof.TPM
	if spec.Accel == "" {
		// The KVM probe boots a Linux kernel; a disk guest has none of
		// its own, so it borrows one of our guests' (or the host's).
		spec.Accel, _ = vm.DetectAccel(spec.QEMU, b.probeKernel())
	}
	v, err := startRecorded(ctx, spec, rec)
	if err != nil {
		return nil, err
	}
	return &qgaHandle{handle: handle{v: v, cgroup: spec.Cgroup}, os: osName, bootTimeout: b.opt.BootTimeout, log: b.log}, nil
}

// probeKernel is a Linux kernel for the KVM probe: one of the guests made
// under GuestCache, else the host's; "" if there is none (the probe then
// settles on tcg and says why).
func (b *Backend) probeKernel() string {
	for _, pattern := range []string{filepath.Join(b.opt.GuestCache, "*", "vmlinuz"), "/boot/vmlinuz-*"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return m[len(m)-1]
		}
	}
	return ""
}

// startRecorded records the VM's cgroup and state directory in the ledger,
// in acquisition order, before starting it.
func startRecorded(ctx context.Context, spec vm.Spec, rec ledger.Recorder) (*vm.VM, error) {
	if err := rec.Record(ctx, ledger.Resource{Kind: KindCgroup, Key: spec.Cgroup}); err != nil {
		return nil, err
	}
	if err := rec.Record(ctx, ledger.Resource{Kind: KindVM, Key: spec.Dir}); err != nil {
		return nil, err
	}
	return vm.Start(ctx, spec)
}

// spec is the VM of a sandbox with limits: memory in MiB (at least 128),
// whole vCPUs (at least one).
func (b *Backend) spec(id string, g *vm.Guest, lim sandbox.Limits) vm.Spec {
	mem := int(lim.MemoryBytes >> 20)
	if mem < 128 {
		mem = vm.DefaultMemoryMiB
	}
	cpus := int(lim.CPUs + 0.999)
	if cpus < 1 {
		cpus = 1
	}
	return vm.Spec{
		ID: id, Dir: b.dir(id), Guest: g, MemoryMiB: mem, CPUs: cpus,
		Accel: b.opt.Accel, QEMU: b.opt.QEMU, Cgroup: b.cgroupPath(id), RunAs: b.opt.RunAs,
	}
}

// template returns the fast-start template for guest and the machine of
// spec, booting one when there is none.
func (b *Backend) template(ctx context.Context, g *vm.Guest, spec vm.Spec) (string, error) {
	// <guest and machine>-<initramfs>.qcow2: a new agent build (a new
	// initramfs) replaces the template of the same guest and machine.
	machine := sha256.Sum256(fmt.Appendf(nil, "%s|%d|%d|%s|%s", g.Dir, spec.MemoryMiB, spec.CPUs, spec.Accel, spec.RunAs))
	initrd := sha256.Sum256([]byte(g.Initrd))
	prefix := hex.EncodeToString(machine[:6]) + "-"
	name := prefix + hex.EncodeToString(initrd[:4])
	path := filepath.Join(b.opt.GuestCache, "templates", name+".qcow2")
	b.tmplMu.Lock()
	defer b.tmplMu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	// VMs copy their template at start, so older ones can go.
	if old, err := filepath.Glob(filepath.Join(b.opt.GuestCache, "templates", prefix+"*.qcow2")); err == nil {
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	t := spec
	t.ID = "tmpl-" + name
	t.Dir = b.dir(t.ID)
	t.Cgroup = b.cgroupPath(t.ID)
	// A template VM left by a crash is removed first.
	if err := vm.Remove(ctx, t.Dir); err != nil {
		return "", err
	}
	start := time.Now()
	v, err := vm.Start(ctx, t)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, vm.BootBudget(v.Accel()))
	defer cancel()
	if err := v.WaitReady(wctx); err != nil {
		_ = v.Destroy(context.WithoutCancel(ctx))
		return "", err
	}
	if err := v.SaveTemplate(ctx, path); err != nil {
		_ = v.Destroy(context.WithoutCancel(ctx))
		return "", err
	}
	b.log.Info("vm fast-start template saved", "template", path, "boot_and_save", time.Since(start))
	return path, nil
}

// Adopt implements sandbox.Backend: QEMU must be running with the recorded
// pid and start time and answer on QMP.
func (b *Backend) Adopt(ctx context.Context, req sandbox.AdoptRequest) (sandbox.Handle, error) {
	dir, cg := "", ""
	for _, r := range req.Resources {
		switch r.Kind {
		case KindVM:
			dir = r.Key
		case KindCgroup:
			cg = r.Key
		}
	}
	if dir == "" {
		return nil, errors.New("no vm in the ledger")
	}
	v, err := vm.Adopt(ctx, dir)
	if err != nil {
		return nil, err
	}
	if id := req.Identity; id.PID != 0 && (id.PID != v.PID() || id.StartTime != v.StartTime()) {
		v.Close()
		return nil, fmt.Errorf("qemu pid %d does not match the recorded %d", v.PID(), id.PID)
	}
	if req.Spec.BootDisk != "" {
		return &qgaHandle{handle: handle{v: v, cgroup: cg}, os: req.Spec.Language, bootTimeout: b.opt.BootTimeout, log: b.log}, nil
	}
	return &handle{v: v, cgroup: cg}, nil
}

// Scan implements sandbox.Backend: VM state dirs and VM cgroups.
func (b *Backend) Scan(ctx context.Context) (map[string][]ledger.Resource, error) {
	out := map[string][]ledger.Resource{}
	var errs []error
	// In acquisition order reversed (Release takes extras in the order
	// given): the VM before its cgroup.
	if ents, err := os.ReadDir(filepath.Join(b.opt.RunDir, "vms")); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	} else {
		for _, e := range ents {
			// Template VMs (tmpl-*) belong to no sandbox: template() boots
			// them and removes one a crash left before booting it again.
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !strings.HasPrefix(e.Name(), "tmpl-") {
				out[e.Name()] = append(out[e.Name()], ledger.Resource{Kind: KindVM, Key: b.dir(e.Name())})
			}
		}
	}
	if names, err := cgroups.Children(filepath.Join(b.opt.CgroupParent, "vms")); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range names {
			if !strings.HasPrefix(n, "tmpl-") {
				out[n] = append(out[n], ledger.Resource{Kind: KindCgroup, Key: b.cgroupPath(n)})
			}
		}
	}
	return out, errors.Join(errs...)
}

// handle is one VM sandbox.
type handle struct {
	v      *vm.VM
	cgroup string
}

// Capabilities implements sandbox.Handle.
func (h *handle) Capabilities() sandbox.Capabilities { return agentCapabilities }

func (h *handle) Done() <-chan struct{}                      { return h.v.Done() }
func (h *handle) ExitDescription() string                    { return h.v.ExitDescription() }
func (h *handle) Dial(ctx context.Context) (net.Conn, error) { return h.v.DialAgent(ctx) }
func (h *handle) CgroupPath() string                         { return h.cgroup }
func (h *handle) OOMKills() (uint64, error)                  { return cgroups.OOMKills(h.cgroup) }

func (h *handle) Identity() sandbox.Identity {
	return sandbox.Identity{PID: h.v.PID(), StartTime: h.v.StartTime()}
}

// Usage reads QEMU's cgroup: guest RAM the guest touched plus QEMU's own.
func (h *handle) Usage(ctx context.Context) (*sandbox.Usage, error) {
	u, err := cgroups.ReadUsage(h.cgroup)
	if err != nil {
		return nil, err
	}
	return &sandbox.Usage{
		MemoryBytes: u.MemoryBytes, MemoryMaxBytes: u.MemoryMaxBytes, CPUSeconds: u.CPUSeconds,
		Pids: u.Pids, OOMKills: u.OOMKills, CPUThrottledSec: u.CPUThrottledSec,
	}, nil
}

// Pause implements sandbox.Pauser: the vCPUs stop (QMP stop). A disk
// guest's handle has the method too, but not the capability: adopting a
// paused guest reached only through qemu-ga would wait for an answer that
// cannot come.
func (h *handle) Pause(ctx context.Context) error { return h.v.Pause(ctx) }

// Resume implements sandbox.Pauser (QMP cont).
func (h *handle) Resume(ctx context.Context) error { return h.v.Resume(ctx) }

// Paused implements sandbox.Pauser.
func (h *handle) Paused() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.v.Paused(ctx)
}

// SaveSnapshot implements sandbox.MachineSnapshotter.
func (h *handle) SaveSnapshot(ctx context.Context, name string) error {
	if err := vm.CheckSnapshotName(name); err != nil {
		return err
	}
	return vmError(h.v.Snapshot(ctx, name))
}

// RestoreSnapshot implements sandbox.MachineSnapshotter: an unknown name
// is not_found, naming the ones there are.
func (h *handle) RestoreSnapshot(ctx context.Context, name string) error {
	if err := vm.CheckSnapshotName(name); err != nil {
		return err
	}
	names, err := h.v.Snapshots(ctx)
	if err != nil {
		return vmError(err)
	}
	if !slices.Contains(names, name) {
		return errdefs.NotFoundf("name: VM %s has no snapshot %q (has: %s)", h.v.ID(), name, strings.Join(names, ", "))
	}
	return vmError(h.v.Restore(ctx, name))
}

// Snapshots implements sandbox.MachineSnapshotter, sorted by name.
func (h *handle) Snapshots(ctx context.Context) ([]string, error) {
	names, err := h.v.Snapshots(ctx)
	if err != nil {
		return nil, vmError(err)
	}
	sort.Strings(names)
	return names, nil
}

// Screenshot implements sandbox.Screenshotter.
func (h *handle) Screenshot(ctx context.Context) ([]byte, error) {
	png, err := h.v.Screenshot(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "screenshot of VM %s", h.v.ID())
	}
	return png, nil
}

// vmError gives an error of pkg/vm without a code the internal one.
func vmError(err error) error {
	if err == nil || errdefs.CodeOf(err) != errdefs.Internal {
		return err
	}
	return errdefs.Wrap(errdefs.Internal, err, "vm")
}

// Describe implements sandbox.Describer: the guest OS, the accelerator
// and what reaches the guest (DescribeGuestAgent).
func (h *handle) Describe(context.Context) map[string]string {
	return map[string]string{DescribeOS: vm.OSLinux, DescribeAccel: h.v.Accel(), DescribeGuestAgent: GuestAgentSandbox}
}

// Describe implements sandbox.Describer for a disk guest.
func (h *qgaHandle) Describe(context.Context) map[string]string {
	return map[string]string{DescribeOS: h.os, DescribeAccel: h.v.Accel(), DescribeGuestAgent: GuestAgentQGA}
}

// Keys of Describe, and the guest agents.
const (
	DescribeOS         = "os"
	DescribeAccel      = "accel"
	DescribeGuestAgent = "guest_agent"
	GuestAgentSandbox  = "sandbox-agent"
	GuestAgentQGA      = "qemu-ga"
)

// VM returns the VM behind a handle of this backend, or nil (the engine
// closes the daemon's connections to the live VMs when it closes).
func VM(h sandbox.Handle) *vm.VM {
	switch vh := h.(type) {
	case *handle:
		return vh.v
	case *qgaHandle:
		return vh.v
	}
	return nil
}

// qgaHandle is a VM sandbox booting an administrator's disk: no
// sandbox-agent, ready when qemu-ga answers (sandbox.Agentless).
type qgaHandle struct {
	handle
	os          string
	bootTimeout time.Duration
	log         *slog.Logger
}

var _ sandbox.Agentless = (*qgaHandle)(nil)

// Capabilities implements sandbox.Handle: what qemu-ga can do.
func (h *qgaHandle) Capabilities() sandbox.Capabilities { return qgaCapabilities }

// NoAgent implements sandbox.Agentless.
func (h *qgaHandle) NoAgent() string {
	return fmt.Sprintf("the %s guest runs only the QEMU guest agent, no sandbox agent: exec_command, file_read and file_write go through qemu-ga (as root/SYSTEM, absolute paths), sandbox_snapshot saves the whole machine; jobs, terminals, listings and ports need the sandbox agent", h.os)
}

// Dial implements sandbox.Handle: there is no agent to dial.
func (h *qgaHandle) Dial(context.Context) (net.Conn, error) {
	return nil, errdefs.Unavailablef("%s", h.NoAgent())
}

// WaitReady implements sandbox.Agentless: qemu-ga answers
// guest-sync-delimited within vm.boot_timeout.
func (h *qgaHandle) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, h.bootTimeout, errBootTimeout)
	defer cancel()
	err := h.v.WaitReady(ctx)
	if err != nil && errors.Is(context.Cause(ctx), errBootTimeout) {
		// Not wrapped: WaitReady's error repeats the raw console.
		return errdefs.Unavailablef("vm.boot_timeout: the %s guest's QEMU guest agent did not answer within %s (is qemu-ga installed and started at boot, and does the disk boot on this machine: q35, UEFI?); console: %s",
			h.os, h.bootTimeout, consoleText(h.v.Console(4000), 1000))
	}
	return err
}

var errBootTimeout = errors.New("vm.boot_timeout reached")

// terminalControl matches the escape sequences firmware and boot loaders
// write to the serial console (cursor moves, screen clears).
var terminalControl = regexp.MustCompile(`\x1b(\[[0-9;=?]*[ -/]*[@-~]|[@-Z\\-_])`)

// consoleText is the last max bytes of a console log as text for an error
// message: escape sequences and carriage returns removed, other control
// characters dropped, lines joined with " | ".
func consoleText(raw string, max int) string {
	s := terminalControl.ReplaceAllString(raw, "")
	s = strings.Map(func(r rune) rune {
		if r == '\n' {
			return r
		}
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	s = strings.Join(lines, " | ")
	if len(s) > max {
		s = "…" + strings.ToValidUTF8(s[len(s)-max:], "")
	}
	if s == "" {
		return "(empty)"
	}
	return s
}

// AgentStartup implements sandbox.AgentStarter: how long a cold boot may
// take on this host now, derived from a measured boot and the host's CPU
// contention (vm.BootBudget): a TCG boot on a saturated host takes minutes.
// The first start of a guest also boots its fast-start template inside
// Start, under the same budget, before this wait.
func (b *Backend) AgentStartup() time.Duration { return vm.BootBudget(b.accel()) }

// accel is the accelerator VMs run with: the configured one, else the
// probe's outcome ("" before the probe ran: BootBudget then assumes TCG,
// the slower).
func (b *Backend) accel() string {
	if b.opt.Accel != "" {
		return b.opt.Accel
	}
	a, _, _ := vm.ProbedAccel()
	return a
}
