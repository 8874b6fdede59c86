package engine

// VMs: the VM backend (pkg/sandbox/qemu) as the engine offers it —
// sandbox_create {backend: vm}, run_code {backend: vm} and vm_test. A VM is
// a sandbox whose Spec.Backend is "vm": the sandbox manager runs its state
// machine, ledger, reaper and reconciliation exactly as for containers, and
// every sandbox operation goes through the manager, which checks the VM
// handle's capabilities (our agent in our guests; qemu-ga in an
// administrator's disk) and routes it. What only a VM has (machine
// snapshots, screenshots) are capabilities too (snapshot.go, Screenshot).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/qemu"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
)

// Backend names of sandbox_create {backend}.
const (
	BackendContainer = "container"
	BackendVM        = "vm"
)

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
				if err := qemu.CheckWindowsEnv(k, v); err != nil {
					return nil, err
				}
			}
		}
		// The OS is the VM's "language": it is what the sandbox record
		// keeps of a disk guest, and sandbox_get reports it (vm.os).
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

// createVM starts the VM of a sandbox_create {backend: vm}. progress, if
// not nil, sees phase lines of a slow start: the build of a guest image on
// its first use (its log lines), the boot of a disk guest. Fields only a
// container has are refused, naming the field.
func (e *Engine) createVM(ctx context.Context, req CreateSandboxRequest, progress func(string)) (*sandbox.Info, error) {
	for field, set := range map[string]bool{
		"pids": req.Pids != nil, "disk_mb": req.DiskMB != nil, "inodes": req.Inodes != nil,
		"disk_backing": req.DiskBacking != "", "allow": len(req.Allow) > 0, "credentials": len(req.Credentials) > 0,
		"network_bandwidth": req.NetworkBandwidth != nil, "network_conn_rate": req.NetworkConnRate != nil,
		"seccomp_profile": req.SeccompProfile != "", "from_snapshot": req.FromSnapshot != "", "root": req.Root,
	} {
		if set {
			return nil, errdefs.Invalidf("%s: not supported with backend vm (a VM is sized by memory_mb and cpus; its guest is its boundary)", field)
		}
	}
	if req.Network != "" && req.Network != NetworkNone {
		return nil, errdefs.Unavailablef("network: VMs have no network device yet; use network none with backend vm")
	}
	if _, ok := req.Labels[RequestIDLabel]; ok {
		return nil, errdefs.Invalidf("labels.%s: reserved; use request_id", RequestIDLabel)
	}
	if req.RequestID != "" && !requestIDRe.MatchString(req.RequestID) {
		return nil, errdefs.Invalidf("request_id: %q is not 1 to 128 letters, digits and ._:- (starting with a letter or digit)", req.RequestID)
	}
	imageName := req.Image
	if imageName == "" {
		imageName = req.Language
	}
	spec, err := e.vmSpec(ctx, req.OS, imageName, req.MemoryMB, req.CPUs, req.Labels, req.Env, progress)
	if err != nil {
		return nil, err
	}
	if req.TTLSeconds != nil {
		if spec.TTL, err = wholeSeconds("ttl_seconds", *req.TTLSeconds, e.cfg.Sandbox.MaxLifetime.D()); err != nil {
			return nil, err
		}
	}
	if req.RequestID != "" {
		e.requestMu.Lock()
		defer e.requestMu.Unlock()
		if info, err := e.sandboxByRequestID(ctx, req.RequestID); info != nil || err != nil {
			return info, err
		}
		spec.Labels = maps.Clone(spec.Labels)
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[RequestIDLabel] = req.RequestID
	}
	if progress != nil && spec.BootDisk != "" {
		progress(fmt.Sprintf("booting %s from %s until its QEMU guest agent answers (at most vm.boot_timeout, %s)…", spec.Language, spec.BootDisk, e.cfg.VM.BootTimeout))
	}
	info, err := e.startVM(ctx, spec)
	if err != nil {
		return nil, err
	}
	e.describeVM(ctx, info, false)
	return info, nil
}

// vmOS is the guest OS of a VM's record: a disk guest's language is its OS
// (vmSpec); every other VM is one of our Linux guests.
func vmOS(info *sandbox.Info) string {
	if info.Language == vm.OSWindows {
		return vm.OSWindows
	}
	return vm.OSLinux
}

// describeVM adds what only a VM has to its description (nothing for a
// container): its OS, and for a live one what its handle says (the
// accelerator, the guest agent) and, with snapshots, its machine snapshots.
func (e *Engine) describeVM(ctx context.Context, info *sandbox.Info, snapshots bool) {
	if info.Backend != BackendVM {
		return
	}
	info.VM = &apitypes.VMInfo{OS: vmOS(info)}
	if !info.State.Live() {
		return
	}
	if d := e.sandboxes.Describe(ctx, info.ID); d != nil {
		info.VM.Accel, info.VM.GuestAgent = d[qemu.DescribeAccel], d[qemu.DescribeGuestAgent]
	}
	if snapshots {
		if names, err := e.sandboxes.MachineSnapshots(ctx, info.ID); err == nil {
			info.VM.Snapshots = names
		}
	}
}

// ScreenshotSandbox returns a live sandbox's screen as PNG
// (sandbox_screenshot): a VM's display; a sandbox without a screen answers
// unavailable naming the screenshot capability.
func (e *Engine) ScreenshotSandbox(ctx context.Context, id string) ([]byte, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	return e.sandboxes.Screenshot(ctx, id)
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
		clean, err := pipeline.WorkspaceRel("files."+p, p)
		if err != nil {
			return nil, err
		}
		files[clean] = []byte(content)
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	budget, err := e.pipeline.RunBudget("timeout_seconds", req.TimeoutSeconds)
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
	res := &apitypes.VMTestResult{SandboxID: info.ID, FailedStep: -1, Steps: []apitypes.VMTestStep{}}
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
	run, err := e.pipeline.StartRun(ctx, pipeline.RunSpec{Handler: &lang.Handler{Name: info.Language}, Kind: "vm_test",
		SandboxID: info.ID, Deadline: time.Now().Add(budget)})
	if err != nil {
		return nil, err
	}
	res.RunID = run.Record.ID
	guestOS := "" // a guest with only qemu-ga: files and steps through it
	if spec.BootDisk != "" {
		guestOS = spec.Language
	}
	runRes, runErr := e.vmTestSteps(ctx, run, req, files, res, guestOS)
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
// the sandbox agent, or through qemu-ga on a guest of guestOS with only
// that (in a directory of the run: qemu.GuestTestDir).
func (e *Engine) vmTestSteps(ctx context.Context, run *pipeline.CodeRun, req apitypes.VMTestRequest, files map[string][]byte, res *apitypes.VMTestResult, guestOS string) (*apitypes.RunResult, error) {
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
	if guestOS != "" {
		dir = qemu.GuestTestDir(guestOS, run.Record.ID)
		if err := e.guestMkdir(ctx, res.SandboxID, dir); err != nil {
			return nil, err
		}
		for _, n := range names {
			if _, err := e.sandboxes.WriteFile(ctx, res.SandboxID, agent.WriteFileRequest{Path: qemu.GuestJoin(guestOS, dir, n), Size: int64(len(files[n]))}, bytes.NewReader(files[n])); err != nil {
				return nil, err
			}
		}
	} else if err := run.WriteFiles(ctx, files, names); err != nil {
		return nil, err
	}
	a := &pipeline.Attempt{Env: req.Env}
	rr := &apitypes.RunResult{RunID: run.Record.ID, SandboxID: res.SandboxID, Language: run.Language(), Steps: []apitypes.RunStep{}}
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
		var st *apitypes.RunStep
		var err error
		if guestOS != "" {
			st, err = e.guestTestStep(ctx, run, res.SandboxID, guestOS, a, rr, name, dir, s.cmd)
		} else {
			st, err = run.Step(ctx, a, rr, name, []string{"/bin/sh", "-c", s.cmd})
		}
		if err != nil {
			return nil, err
		}
		res.Steps = append(res.Steps, apitypes.VMTestStep{RunStep: *st, Phase: s.phase, Command: s.cmd})
		if !pipeline.StepOK(st) {
			rr.Success = false
			res.FailedStep = i
			png, err := e.sandboxes.Screenshot(ctx, res.SandboxID)
			if err != nil {
				e.log.Warn("vm_test screenshot", "vm", res.SandboxID, "err", err)
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

// guestMkdir makes directory dir (and its parents) in VM id's guest,
// which runs only qemu-ga.
func (e *Engine) guestMkdir(ctx context.Context, id, dir string) error {
	h, _, err := e.sandboxes.Handle(ctx, id)
	if err != nil {
		return err
	}
	return qemu.GuestMkdir(ctx, h, dir)
}

// guestTestStep runs one vm_test step on a guest of osName with only
// qemu-ga, in dir, under what is left of the run's deadline, and records
// it like the pipeline's steps. It is an exec_command like any other: the
// sandbox manager routes it to the guest agent.
func (e *Engine) guestTestStep(ctx context.Context, run *pipeline.CodeRun, id, osName string, a *pipeline.Attempt, res *apitypes.RunResult, name, dir, command string) (*apitypes.RunStep, error) {
	line := "cd '" + dir + "' && " + command
	if osName == vm.OSWindows {
		line = `cd /d "` + dir + `" && ` + command
	}
	remaining := min(time.Until(run.Deadline()), e.cfg.Sandbox.MaxExecTimeout.D())
	var er *sandbox.ExecResult
	if remaining < 10*time.Millisecond {
		er = &sandbox.ExecResult{ExitCode: -1, Termination: sandbox.Termination{Cause: sandbox.CauseTimeout, Detail: "no time left for this step"}}
	} else {
		secs := remaining.Seconds()
		var err error
		if er, err = e.Exec(ctx, ExecRequest{SandboxID: id, Command: line, Env: a.Env, TimeoutSeconds: &secs,
			MaxOutputBytes: a.MaxOutputBytes}, run.RecordOutput(a)); err != nil {
			return nil, err
		}
	}
	prog, args, _ := qga.ShellCommand(osName, line)
	return run.RecordStep(res, name, append([]string{prog}, args...), er), nil
}
