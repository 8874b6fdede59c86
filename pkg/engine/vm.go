package engine

// VMs: the VM backend (pkg/sandbox/qemu) as the engine offers it — vm_*
// tools, /v1/vms, `sandboxctl vm` and run_code {backend: vm}. A VM is a
// sandbox whose Spec.Backend is "vm": the sandbox manager runs its state
// machine, ledger, reaper and reconciliation exactly as for containers,
// and the agent inside the guest serves the same protocol, so exec and
// files are the sandbox operations. What only a VM has (snapshots,
// screenshots, the accelerator) goes through the backend's handle.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/qemu"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// BackendVM is the sandbox backend name of VMs.
const BackendVM = "vm"

// vmDefaultMemoryMiB is a VM's RAM when the request names none: enough
// for an interpreter and a test suite, and small enough that the
// fast-start snapshot (the guest's touched RAM) stays around 100 MB.
const vmDefaultMemoryMiB = 256

// vmState is the engine's VM backend.
type vmState struct {
	backend *qemu.Backend // nil: VMs are not offered (err says why)
	err     error
	// createMu serialises VM creates, so that counting the live VMs
	// against vm.max_vms and starting one are a single step.
	createMu sync.Mutex
	// buildMu serialises guest image builds on first use.
	buildMu sync.Mutex
}

// initVM constructs the VM backend when vm.max_vms > 0 and QEMU is
// installed. A daemon without QEMU still starts: VM requests then answer
// unavailable with the reason, and readiness reports it.
func (e *Engine) initVM() sandbox.Backend {
	c := e.cfg.VM
	if c.MaxVMs == 0 {
		e.vm.err = errdefs.Unavailablef("VMs are disabled (vm.max_vms: 0)")
		return nil
	}
	if _, err := exec.LookPath(c.QEMU); err != nil {
		e.vm.err = errdefs.Wrap(errdefs.Unavailable, err, "vm.qemu: %s not found (install qemu-system-x86)", c.QEMU)
		e.log.Warn("VM backend not available", "err", e.vm.err)
		return nil
	}
	// QEMU drops to nobody after opening its files (pkg/vm: -runas) where
	// the user exists.
	runAs := ""
	if _, err := user.Lookup("nobody"); err == nil {
		runAs = "nobody"
	}
	b, err := qemu.New(qemu.Options{
		QEMU: c.QEMU, Accel: c.Accel, AgentPath: e.cfg.Paths.AgentPath, RunDir: e.cfg.Paths.RunDir,
		GuestCache: e.guestCache(), CgroupParent: e.cfg.Sandbox.CgroupParent, RunAs: runAs,
		FastStart: true, Log: e.log,
		Profile:     func(os string) (*vm.Profile, error) { return vm.ResolveProfile(&e.cfg.VM, os) },
		BootTimeout: e.cfg.VM.BootTimeout.D(),
	}, e.ledger)
	if err != nil {
		e.vm.err = errdefs.Wrap(errdefs.Unavailable, err, "VM backend")
		e.log.Warn("VM backend not available", "err", err)
		return nil
	}
	e.vm.backend = b
	return b
}

// detachVMs closes the daemon's QMP and guest-agent connections of the
// live VMs, which keep running (they outlive the daemon like every
// sandbox). A daemon that exits closes them anyway; an engine closed and
// made again in one process (tests) needs it, because QEMU serves one QMP
// client at a time and the new engine adopts the VMs through QMP.
func (e *Engine) detachVMs() {
	if e.vm.backend == nil {
		return
	}
	ctx := context.Background()
	for _, id := range e.sandboxes.IDs() {
		if h, _, err := e.sandboxes.Handle(ctx, id); err == nil {
			if v := qemu.VM(h); v != nil {
				v.Close()
			}
		}
	}
}

// guestCache holds the guests made from images and the fast-start
// templates, beside the images they are made from (shared like them).
func (e *Engine) guestCache() string { return filepath.Join(e.imagesDir(), "vm-guests") }

// vmReadiness is the /readyz line of the VM backend: whether it is there
// and whether it has KVM. The KVM probe boots a guest kernel, so it runs
// once per process at the first VM start (pkg/vm DetectAccel); until then
// readiness says it is not probed yet instead of probing per request.
func (e *Engine) vmReadiness() Check {
	if e.vm.backend == nil {
		return Check{Name: "vm", Status: CheckDegraded, Reason: errdefs.MessageOf(e.vm.err)}
	}
	accel, kvm := "", ""
	switch e.cfg.VM.Accel {
	case vm.AccelKVM, vm.AccelTCG:
		accel, kvm = e.cfg.VM.Accel+" (vm.accel)", fmt.Sprint(e.cfg.VM.Accel == vm.AccelKVM)
	default:
		if a, why, done := vm.ProbedAccel(); done {
			accel, kvm = a+" ("+why+")", fmt.Sprint(a == vm.AccelKVM)
		} else {
			accel, kvm = "auto", "not probed yet (a guest kernel is booted under KVM at the first VM start)"
		}
	}
	return Check{Name: "vm", Status: CheckOK, Reason: fmt.Sprintf("backend qemu (%s), max_vms %d, kvm: %s, accel: %s",
		e.cfg.VM.QEMU, e.cfg.VM.MaxVMs, kvm, accel)}
}

// EnsureVMImage builds the guest image for name ("linux": the Linux test
// guest; a language: that language made into a guest) unless it is up to
// date, and makes it a bootable guest (kernel, initramfs with the agent,
// qcow2 root disk).
func (e *Engine) EnsureVMImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error) {
	if err := checkImageName("name", name); err != nil {
		return nil, err
	}
	if _, err := e.vmRecipe("name", name); err != nil {
		return nil, err
	}
	img, err := e.ensureVMImage(ctx, name, log)
	if err != nil {
		return nil, err
	}
	return e.describedImage(ctx, img)
}

func (e *Engine) ensureVMImage(ctx context.Context, name string, log io.Writer) (*image.Image, error) {
	r, err := e.vmRecipe("image", name)
	if err != nil {
		return nil, err
	}
	b := &image.Builder{Store: e.images, Mirror: e.cfg.Images.Mirror, Suite: e.cfg.Images.Suite, Log: log}
	img, err := b.Ensure(ctx, r)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "build VM guest image %s", r.Name)
	}
	if _, err := vm.PrepareGuest(ctx, img, e.cfg.Paths.AgentPath, e.guestCache()); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "make guest of %s", r.Name)
	}
	return img, nil
}

// vmRecipe is the recipe of the guest image of name (linux or a language);
// an unknown name is an invalid_argument naming field.
func (e *Engine) vmRecipe(field, name string) (*image.Recipe, error) {
	if name == vm.OSLinux {
		return vm.GuestRecipe(e.cfg.Paths.RecipesDir, name, nil)
	}
	r, ok := e.catalog.Recipe(name)
	if !ok {
		return nil, errdefs.Invalidf("%s: no guest image %q: linux or a language (known: %s)", field, name, strings.Join(e.catalog.Names(), ", "))
	}
	return vm.GuestRecipe(e.cfg.Paths.RecipesDir, name, r)
}

// vmImageName resolves the image field of a VM request: "" and "linux"
// are the Linux test guest, a language (or vm-<language>) its guest.
func vmImageName(name string) string {
	name = strings.TrimPrefix(name, "vm-")
	if name == "" {
		return vm.OSLinux
	}
	return name
}

// vmImage returns the built guest image of name, building it on first use
// when images.build_on_demand is on; progress, if not nil, sees the build's
// phase and log lines (it takes minutes).
func (e *Engine) vmImage(ctx context.Context, name string, progress func(string)) (*image.Image, error) {
	if strings.ContainsAny(name, "/\x00") {
		return nil, errdefs.Invalidf("image: malformed image name %q", name)
	}
	if _, err := e.vmRecipe("image", name); err != nil {
		return nil, err
	}
	if img, err := e.images.Get(vm.GuestImageName(name)); err == nil {
		return img, nil
	}
	if !e.cfg.Images.BuildOnDemand {
		return nil, errdefs.Unavailablef("image: the guest image %s is not built; run `sandboxctl images build --vm %s`", vm.GuestImageName(name), name)
	}
	e.vm.buildMu.Lock()
	defer e.vm.buildMu.Unlock()
	if img, err := e.images.Get(vm.GuestImageName(name)); err == nil {
		return img, nil // built meanwhile by the holder of buildMu
	}
	e.log.Info("VM guest image not built yet; building it now (first use)", "image", vm.GuestImageName(name))
	if progress == nil {
		return e.ensureVMImage(ctx, name, io.Discard)
	}
	start := time.Now()
	progress(fmt.Sprintf("building guest image %s (first use; this takes minutes)…", vm.GuestImageName(name)))
	w := &lineWriter{emit: progress}
	img, err := e.ensureVMImage(ctx, name, w)
	w.flush()
	if err != nil {
		return nil, err
	}
	progress(fmt.Sprintf("guest image %s built in %s", img.Name, time.Since(start).Round(time.Second)))
	return img, nil
}

// lineWriter hands every complete line written to it to emit (a build
// log as progress lines).
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(w.buf[:i])); line != "" {
			w.emit(line)
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if line := strings.TrimSpace(string(w.buf)); line != "" {
		w.emit(line)
	}
	w.buf = nil
}

// vmSpec validates a VM request and returns the sandbox spec of the VM.
// A request for windows, or for linux (image "" or linux) when
// vm.images.linux is set, boots that administrator's disk: a QGA guest
// (Spec.BootDisk). A language image is always our built guest.
func (e *Engine) vmSpec(ctx context.Context, osName, imageName string, memoryMB *int64, cpus *float64, labels, env map[string]string, progress func(string)) (*sandbox.Spec, error) {
	if e.vm.backend == nil {
		return nil, e.vm.err
	}
	if osName == "" {
		osName = vm.OSLinux
	}
	prof, err := vm.ResolveProfile(&e.cfg.VM, osName)
	if err != nil {
		return nil, err
	}
	name := vmImageName(imageName)
	disk := prof.QGAOnly() && (prof.OS != vm.OSLinux || name == vm.OSLinux)
	if prof.OS != vm.OSLinux && name != vm.OSLinux && name != prof.OS {
		return nil, errdefs.Invalidf("image: a %s VM boots vm.images.%s; leave image empty (got %q)", prof.OS, prof.OS, imageName)
	}
	mem := int64(vmDefaultMemoryMiB) * mib
	if disk && prof.DefaultMemoryMiB > 0 {
		mem = int64(prof.DefaultMemoryMiB) * mib
		if memoryMB == nil && mem > int64(e.cfg.Sandbox.MaxMemory) {
			return nil, errdefs.Invalidf("memory_mb: a %s VM needs %d MiB by default, more than sandbox.max_memory (%s) allows; raise sandbox.max_memory", prof.OS, prof.DefaultMemoryMiB, e.cfg.Sandbox.MaxMemory)
		}
	}
	if memoryMB != nil {
		if mem, err = megabytes("memory_mb", *memoryMB, int64(prof.MinMemoryMiB)*mib, int64(e.cfg.Sandbox.MaxMemory)); err != nil {
			return nil, err
		}
	}
	n := float64(prof.MinCPUs)
	if cpus != nil {
		n = *cpus
		if !(n >= 1) || n != math.Trunc(n) {
			return nil, errdefs.Invalidf("cpus: a VM has a whole number of virtual CPUs, at least 1; got %v", n)
		}
	}
	if n > e.cfg.Sandbox.MaxCPUs {
		return nil, errdefs.Invalidf("cpus: %v exceeds the maximum %v (sandbox.max_cpus)", n, e.cfg.Sandbox.MaxCPUs)
	}
	if n < float64(prof.MinCPUs) {
		return nil, errdefs.Invalidf("cpus: a %s VM needs at least %d virtual CPUs; got %v", prof.OS, prof.MinCPUs, n)
	}
	if err := checkEnv("env", env); err != nil {
		return nil, err
	}
	if err := checkLabels(labels); err != nil {
		return nil, err
	}
	if disk {
		if prof.OS == vm.OSWindows {
			for k, v := range env {
				if err := checkWindowsEnv(k, v); err != nil {
					return nil, err
				}
			}
		}
		// The OS is the VM's "language": it is what the sandbox record
		// keeps of a disk guest, and vm_get reports it.
		return &sandbox.Spec{
			Language: prof.OS, Image: prof.Disk, BootDisk: prof.Disk, Network: NetworkNone, Backend: BackendVM,
			Limits: sandbox.Limits{MemoryBytes: mem, CPUs: n, Pids: e.cfg.Sandbox.Pids},
			Labels: labels, Env: env,
		}, nil
	}
	img, err := e.vmImage(ctx, name, progress)
	if err != nil {
		return nil, err
	}
	return &sandbox.Spec{
		Language: name, Image: img.Name, Network: NetworkNone, UID: e.cfg.Sandbox.User, Backend: BackendVM,
		Limits: sandbox.Limits{MemoryBytes: mem, CPUs: n, Pids: e.cfg.Sandbox.Pids},
		Labels: labels, Env: env,
	}, nil
}

// startVM starts the VM of spec unless vm.max_vms VMs are live.
func (e *Engine) startVM(ctx context.Context, spec *sandbox.Spec) (*sandbox.Info, error) {
	e.vm.createMu.Lock()
	defer e.vm.createMu.Unlock()
	live, err := e.liveVMs(ctx)
	if err != nil {
		return nil, err
	}
	if len(live) >= e.cfg.VM.MaxVMs {
		return nil, errdefs.LimitExceededf("vm.max_vms: %d VMs are running, the maximum (destroy one first)", len(live))
	}
	start := time.Now()
	info, err := e.sandboxes.Create(ctx, *spec)
	if err != nil {
		return nil, err
	}
	e.log.Info("vm created", "vm", info.ID, "image", spec.Image, "seconds", time.Since(start).Seconds())
	return info, nil
}

func (e *Engine) liveVMs(ctx context.Context) ([]*sandbox.Info, error) {
	all, err := e.sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(s *sandbox.Info) bool { return s.Backend != BackendVM }), nil
}

// CreateVM starts a VM (vm_create). progress, if not nil, sees phase
// lines of a slow start: the build of a guest image on its first use (its
// log lines), the boot of a disk guest.
func (e *Engine) CreateVM(ctx context.Context, req apitypes.VMCreateRequest, progress func(string)) (*apitypes.VM, error) {
	spec, err := e.vmSpec(ctx, req.OS, req.Image, req.MemoryMB, req.CPUs, req.Labels, req.Env, progress)
	if err != nil {
		return nil, err
	}
	if progress != nil && spec.BootDisk != "" {
		progress(fmt.Sprintf("booting %s from %s until its QEMU guest agent answers (at most vm.boot_timeout, %s)…", spec.Language, spec.BootDisk, e.cfg.VM.BootTimeout))
	}
	info, err := e.startVM(ctx, spec)
	if err != nil {
		return nil, err
	}
	return e.describeVM(ctx, info, false), nil
}

// vmOS is the guest OS of a VM's record: a disk guest's language is its OS
// (vmSpec); every other VM is one of our Linux guests.
func vmOS(info *sandbox.Info) string {
	if info.Language == vm.OSWindows {
		return vm.OSWindows
	}
	return vm.OSLinux
}

// describeVM adds what only a VM has to its sandbox record.
func (e *Engine) describeVM(ctx context.Context, info *sandbox.Info, snapshots bool) *apitypes.VM {
	out := &apitypes.VM{Sandbox: *info, OS: vmOS(info)}
	if !info.State.Live() {
		return out
	}
	if h, _, err := e.sandboxes.Handle(ctx, info.ID); err == nil {
		if v := qemu.VM(h); v != nil {
			out.Accel = v.Accel()
			out.GuestAgent = apitypes.GuestAgentSandbox
			if _, ok := qemu.QGAGuest(h); ok {
				out.GuestAgent = apitypes.GuestAgentQGA
			}
			if snapshots {
				if names, err := v.Snapshots(ctx); err == nil {
					out.Snapshots = names
				}
			}
		}
	}
	return out
}

// vmInfo returns VM id's record; it must be a VM.
func (e *Engine) vmInfo(ctx context.Context, id string) (*sandbox.Info, error) {
	if id == "" {
		return nil, errdefs.Invalidf("vm_id: required")
	}
	if len(id) > 64 || strings.ContainsAny(id, "/\x00 ") {
		return nil, errdefs.Invalidf("vm_id: malformed %q", id)
	}
	info, err := e.sandboxes.Get(ctx, id)
	if errdefs.Is(err, errdefs.NotFound) {
		return nil, errdefs.NotFoundf("vm_id: no VM %q", id)
	}
	if err != nil {
		return nil, err
	}
	if info.Backend != BackendVM {
		return nil, errdefs.Invalidf("vm_id: %s is a container sandbox, not a VM (use the sandbox tools)", id)
	}
	return info, nil
}

// liveVM returns the running VM id: exec, files, snapshots and
// screenshots need one.
func (e *Engine) liveVM(ctx context.Context, id string) (*sandbox.Info, *vm.VM, error) {
	r, err := e.liveVMRef(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return r.info, r.v, nil
}

// vmRef is a running VM.
type vmRef struct {
	info *sandbox.Info
	v    *vm.VM
	// qgaOS is the OS of a guest that runs only the QEMU guest agent (a
	// disk guest); empty for our guests with the sandbox agent.
	qgaOS string
}

func (e *Engine) liveVMRef(ctx context.Context, id string) (*vmRef, error) {
	info, err := e.vmInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	if !info.State.Live() {
		return nil, errdefs.Conflictf("vm_id: VM %s is %s (%s)", id, info.State, info.Reason)
	}
	h, _, err := e.sandboxes.Handle(ctx, id)
	if err != nil {
		return nil, errdefs.Conflictf("vm_id: VM %s is not running: %s", id, errdefs.MessageOf(err))
	}
	v := qemu.VM(h)
	if v == nil {
		return nil, errdefs.New(errdefs.Internal, "vm_id: %s has no VM handle", id)
	}
	osName, _ := qemu.QGAGuest(h)
	return &vmRef{info: info, v: v, qgaOS: osName}, nil
}

// GetVM describes a VM, with its snapshots when it runs.
func (e *Engine) GetVM(ctx context.Context, id string) (*apitypes.VM, error) {
	info, err := e.vmInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.describeVM(ctx, info, true), nil
}

// ListVMs lists VMs in state (see ListSandboxes).
func (e *Engine) ListVMs(ctx context.Context, state string) ([]*apitypes.VM, error) {
	all, err := e.ListSandboxes(ctx, state)
	if err != nil {
		return nil, err
	}
	out := []*apitypes.VM{}
	for _, s := range all {
		if s.Backend == BackendVM {
			out = append(out, e.describeVM(ctx, s, false))
		}
	}
	return out, nil
}

// DestroyVM stops a VM and removes its QEMU process, overlay, sockets
// and cgroup (through the ledger).
func (e *Engine) DestroyVM(ctx context.Context, id string) (*apitypes.VM, error) {
	if _, err := e.vmInfo(ctx, id); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Terminate(ctx, id, "destroyed by request")
	if err != nil {
		return nil, err
	}
	return &apitypes.VM{Sandbox: *info, OS: vmOS(info)}, nil
}

// VMExec runs a command in a VM (vm_exec): exec_command on the VM, or
// through qemu-ga on a guest that runs only that (vm_qga.go).
func (e *Engine) VMExec(ctx context.Context, req apitypes.VMExecRequest, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	r, err := e.liveVMRef(ctx, req.VMID)
	if err != nil {
		return nil, err
	}
	if r.qgaOS != "" {
		return e.qgaExec(ctx, r, req, onOutput)
	}
	return e.Exec(ctx, req.ExecRequest(), onOutput)
}

// VMWriteFile writes a file in a VM (vm_file_write).
func (e *Engine) VMWriteFile(ctx context.Context, req apitypes.VMFileWriteRequest) (*FileResult, error) {
	r, err := e.liveVMRef(ctx, req.VMID)
	if err != nil {
		return nil, err
	}
	if r.qgaOS != "" {
		return e.qgaWriteFile(ctx, r, req)
	}
	return e.WriteFile(ctx, FileWriteRequest{SandboxID: req.VMID, Path: req.Path, Content: req.Content, Encoding: req.Encoding, Mode: req.Mode})
}

// VMReadFile reads a file in a VM (vm_file_read).
func (e *Engine) VMReadFile(ctx context.Context, req apitypes.VMFileReadRequest) (*FileReadResult, error) {
	r, err := e.liveVMRef(ctx, req.VMID)
	if err != nil {
		return nil, err
	}
	if r.qgaOS != "" {
		return e.qgaReadFile(ctx, r, req)
	}
	return e.ReadFile(ctx, FileReadRequest{SandboxID: req.VMID, Path: req.Path, Encoding: req.Encoding, Offset: req.Offset, MaxBytes: req.MaxBytes})
}

// SnapshotVM saves the running VM's whole state under a name (vm_snapshot).
func (e *Engine) SnapshotVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error) {
	return e.snapshotOp(ctx, req, (*vm.VM).Snapshot)
}

// RestoreVM returns the VM to a snapshot (vm_restore): files written
// since are gone, processes started since never ran.
func (e *Engine) RestoreVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error) {
	return e.snapshotOp(ctx, req, func(v *vm.VM, ctx context.Context, name string) error {
		names, err := v.Snapshots(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(names, name) {
			return errdefs.NotFoundf("name: VM %s has no snapshot %q (has: %s)", req.VMID, name, strings.Join(names, ", "))
		}
		return v.Restore(ctx, name)
	})
}

func (e *Engine) snapshotOp(ctx context.Context, req apitypes.VMSnapshotRequest, op func(*vm.VM, context.Context, string) error) (*apitypes.VMSnapshotResult, error) {
	if err := vm.CheckSnapshotName(req.Name); err != nil {
		return nil, err
	}
	_, v, err := e.liveVM(ctx, req.VMID)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := op(v, ctx, req.Name); err != nil {
		if errdefs.CodeOf(err) == errdefs.Internal {
			return nil, errdefs.Wrap(errdefs.Internal, err, "VM %s", req.VMID)
		}
		return nil, err
	}
	res := &apitypes.VMSnapshotResult{VMID: req.VMID, Name: req.Name, DurationMS: time.Since(start).Milliseconds()}
	if res.Snapshots, err = v.Snapshots(ctx); err != nil {
		res.Snapshots = []string{req.Name}
	}
	sort.Strings(res.Snapshots)
	return res, nil
}

// ScreenshotVM returns the VM's screen as PNG (vm_screenshot).
func (e *Engine) ScreenshotVM(ctx context.Context, id string) ([]byte, error) {
	_, v, err := e.liveVM(ctx, id)
	if err != nil {
		return nil, err
	}
	png, err := v.Screenshot(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "screenshot of VM %s", id)
	}
	return png, nil
}

// createRunVM starts the VM of a run_code {backend: vm}: the language's
// guest, labelled like the run's sandboxes.
func (e *Engine) createRunVM(ctx context.Context, language string, req CreateSandboxRequest) (*sandbox.Info, error) {
	if req.Network != "" && req.Network != NetworkNone {
		return nil, errdefs.Unavailablef("network: VMs have no network device yet; use network none with backend vm")
	}
	var cpus *float64
	if req.CPUs != nil {
		c := math.Ceil(*req.CPUs)
		cpus = &c
	}
	spec, err := e.vmSpec(ctx, vm.OSLinux, language, req.MemoryMB, cpus, req.Labels, nil, nil)
	if err != nil {
		return nil, err
	}
	return e.startVM(ctx, spec)
}

// VM test phases.
const (
	vmTestSetup = "setup"
	vmTestTest  = "test"
)

// VMTest copies files into a clean VM, runs the setup then the test
// commands (stopping at the first that fails), takes a screenshot when one
// fails, and keeps a run record (kind vm_test) of it all. On a guest with
// only qemu-ga the files go to a directory of the run (qgaTestDir) and the
// steps run there through the guest's shell (cmd.exe on Windows).
func (e *Engine) VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error) {
	if len(req.Test) == 0 {
		return nil, errdefs.Invalidf("test: at least one test command is required")
	}
	for field, cmds := range map[string][]string{"setup": req.Setup, "test": req.Test} {
		for i, c := range cmds {
			if strings.TrimSpace(c) == "" || strings.ContainsRune(c, 0) {
				return nil, errdefs.Invalidf("%s[%d]: empty command or NUL byte", field, i)
			}
		}
	}
	files := map[string][]byte{}
	for p, content := range req.Files {
		clean, err := WorkspaceRel("files."+p, p)
		if err != nil {
			return nil, err
		}
		files[clean] = []byte(content)
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	budget, err := e.runBudget("timeout_seconds", req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	spec, err := e.vmSpec(ctx, req.OS, req.Image, req.MemoryMB, req.CPUs, map[string]string{"sandboxd.vm_test": "1"}, nil, nil)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	info, err := e.startVM(ctx, spec)
	if err != nil {
		return nil, err
	}
	res := &apitypes.VMTestResult{VMID: info.ID, FailedStep: -1, Steps: []apitypes.VMTestStep{}}
	if !req.Keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if _, err := e.sandboxes.Terminate(dctx, info.ID, "vm_test done"); err != nil {
				e.log.Error("destroy vm_test VM", "vm", info.ID, "err", err)
			} else {
				res.Destroyed = true
			}
		}()
	}
	// The run record: the pipeline's, bound to the VM (a handler with the
	// VM's language name and no commands of its own).
	run, err := e.StartRun(ctx, RunSpec{Handler: &lang.Handler{Name: info.Language}, Kind: "vm_test",
		SandboxID: info.ID, Deadline: time.Now().Add(budget)})
	if err != nil {
		return nil, err
	}
	res.RunID = run.Record.ID
	var guest *vmRef // a guest with only qemu-ga: files and steps through it
	if spec.BootDisk != "" {
		if guest, err = e.liveVMRef(ctx, info.ID); err != nil {
			_ = run.Finish(context.WithoutCancel(ctx), nil, err)
			return nil, err
		}
	}
	runRes, runErr := e.vmTestSteps(ctx, run, req, files, res, guest)
	if err := run.Finish(context.WithoutCancel(ctx), runRes, runErr); err != nil {
		e.log.Error("write run record", "run", run.Record.ID, "err", err)
	}
	res.DurationMS = time.Since(start).Milliseconds()
	if runErr != nil {
		return nil, runErr
	}
	return res, nil
}

// vmTestSteps writes the files and runs the steps of a vm_test: through
// the sandbox agent, or through qemu-ga on a guest with only that (guest
// not nil; vm_qga.go).
func (e *Engine) vmTestSteps(ctx context.Context, run *CodeRun, req apitypes.VMTestRequest, files map[string][]byte, res *apitypes.VMTestResult, guest *vmRef) (*RunResult, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := run.Record.WriteSnapshot("", files); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "write code snapshot")
	}
	run.Meta.Files = names
	var dir string
	if guest != nil {
		dir = qgaTestDir(guest.qgaOS, run.Record.ID)
		if err := e.qgaMkdir(ctx, guest, dir); err != nil {
			return nil, err
		}
		for _, n := range names {
			if _, err := e.qgaWrite(ctx, guest, qgaJoin(guest.qgaOS, dir, n), "", files[n]); err != nil {
				return nil, err
			}
		}
	} else if err := run.writeFiles(ctx, files, names, ""); err != nil {
		return nil, err
	}
	a := &Attempt{Env: req.Env}
	rr := &RunResult{RunID: run.Record.ID, SandboxID: res.VMID, Language: run.h.Name, Steps: []RunStep{}}
	type step struct{ phase, cmd string }
	var steps []step
	for _, c := range req.Setup {
		steps = append(steps, step{vmTestSetup, c})
	}
	for _, c := range req.Test {
		steps = append(steps, step{vmTestTest, c})
	}
	rr.Success = true
	for i, s := range steps {
		name := fmt.Sprintf("%s %d", s.phase, i+1)
		var st *RunStep
		var err error
		if guest != nil {
			st, err = e.qgaTestStep(ctx, run, guest, a, rr, name, dir, s.cmd)
		} else {
			st, err = run.step(ctx, a, rr, name, []string{"/bin/sh", "-c", s.cmd}, nil, nil)
		}
		if err != nil {
			return nil, err
		}
		res.Steps = append(res.Steps, apitypes.VMTestStep{RunStep: *st, Phase: s.phase, Command: s.cmd})
		if !stepOK(st) {
			rr.Success = false
			res.FailedStep = i
			png, err := e.ScreenshotVM(ctx, res.VMID)
			if err != nil {
				e.log.Warn("vm_test screenshot", "vm", res.VMID, "err", err)
				break
			}
			res.Screenshot = png
			if err := run.Record.WriteFile("screenshot.png", png); err != nil {
				e.log.Warn("vm_test screenshot", "run", run.Record.ID, "err", err)
			}
			break
		}
	}
	res.Passed = rr.Success
	return rr, nil
}

// CheckLiveVM reports whether id is a running VM, with the error a VM
// operation on it would get (front ends that route sandbox operations to
// VMs check with it first).
func (e *Engine) CheckLiveVM(ctx context.Context, id string) error {
	_, _, err := e.liveVM(ctx, id)
	return err
}
