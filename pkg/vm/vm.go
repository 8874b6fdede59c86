// Package vm supervises QEMU virtual machines: one qemu-system-x86_64
// process per VM under its own state directory, with a qcow2 overlay on a
// read-only base disk, the serial console captured to a file, QMP on a unix
// socket (through go-qemu, every call under a timeout, events always
// drained) and the QEMU guest agent on a second socket (package qga). It
// also makes bootable Linux test guests from images of the image store,
// probes for a working KVM, snapshots and restores running VMs, starts VMs
// from a saved snapshot instead of booting them, and takes screenshots.
//
// Security boundary: the guest is untrusted, and so is QEMU once a guest
// runs in it. QEMU runs with its own seccomp filter (-sandbox on, no
// spawning, no privilege changes, no obsolete syscalls, no resource
// control), drops to an unprivileged user (-runas) after opening its files
// when Spec.RunAs is set, and is placed in a cgroup that holds the VM's
// memory and CPU limits. The guest has no network device; the host talks
// to it only through the guest-agent channel, whose every reply is
// untrusted input to the daemon (see package qga).
package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/qga"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/vport"
)

// Files in a VM's state directory.
const (
	qmpSocket  = "qmp.sock"
	qgaSocket  = "qga.sock"
	agentSock  = "agent.sock"
	consoleLog = "console.log"
	qemuLog    = "qemu.log"
	overlay    = "overlay.qcow2"
	stateFile  = "vm.json"
	shotsDir   = "shots"
	varsFile   = "vars.qcow2"
	tpmDir     = "tpm"
	tpmSocket  = "tpm.sock"
)

// ReadySnapshot is the internal snapshot a template overlay carries: the
// guest booted, its agent answering.
const ReadySnapshot = "ready"

// Defaults for a Spec.
const (
	DefaultQEMU      = "qemu-system-x86_64"
	DefaultMemoryMiB = 512
	DefaultCPUs      = 1
	// tcgCacheMiB caps TCG's translation cache (QEMU's default is 1 GiB
	// of address space, which would count against the cgroup).
	tcgCacheMiB = 64
	// qemuOverheadMiB is what QEMU needs beyond guest RAM (TCG cache,
	// device state, its own heap), added to the cgroup's memory limit.
	qemuOverheadMiB = 256
)

// Firmware selects UEFI boot: OVMF's code (read-only) and a template of
// its variable store, copied per VM (converted to qcow2 so that savevm
// works: a raw writable pflash refuses snapshots). SecureBoot also turns on
// SMM and the secure flash, as Windows 11 wants.
type Firmware struct {
	Code       string
	Vars       string
	SecureBoot bool
}

// Spec describes a VM to start.
type Spec struct {
	// ID names the VM in logs and QEMU's -name.
	ID string
	// Dir is the VM's state directory; it is created and must not exist.
	// Keep it short: unix socket paths are limited to 107 bytes.
	Dir   string
	Guest *Guest
	// FromTemplate, when set, is a template overlay made by SaveTemplate:
	// it is copied as the VM's overlay and the VM starts from its ready
	// snapshot (-loadvm) instead of booting. The template must have been
	// made with the same machine (memory, CPUs, devices).
	FromTemplate string
	MemoryMiB    int
	CPUs         int
	// Accel is AccelKVM or AccelTCG; empty means DetectAccel.
	Accel string
	QEMU  string
	// Firmware, when set, boots through OVMF instead of SeaBIOS.
	Firmware *Firmware
	// TPM attaches a TPM 2.0 emulated by a per-VM swtpm.
	TPM bool
	// Cgroup is the absolute cgroup path QEMU is placed in with the VM's
	// limits; empty leaves QEMU in the caller's cgroup.
	Cgroup string
	// RunAs is the user QEMU switches to after opening its files; empty
	// keeps it root.
	RunAs string
	// KernelArgs are appended to the guest kernel command line (e.g.
	// "systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all").
	KernelArgs string
	// DataDisks are raw disk images attached read-write after the root
	// disk, in order (the Linux guest sees /dev/vdb, /dev/vdc, ...): e.g.
	// the test binaries and images of make test-cgroupv2. They belong to
	// the caller; Destroy leaves them.
	DataDisks []string
}

// record is vm.json: what adopting a VM after a daemon restart needs.
type record struct {
	ID        string    `json:"id"`
	PID       int       `json:"pid"`
	StartTime uint64    `json:"start_time"` // /proc/<pid>/stat field 22
	TPMPID    int       `json:"tpm_pid,omitempty"`
	TPMStart  uint64    `json:"tpm_start_time,omitempty"`
	Accel     string    `json:"accel"`
	Cgroup    string    `json:"cgroup,omitempty"`
	Args      []string  `json:"args"`
	Started   time.Time `json:"started"`
}

// VM is a running QEMU process.
type VM struct {
	dir string
	rec record

	mon  *monitor
	done chan struct{}

	mu    sync.Mutex
	qga   *qga.Client
	agent *vport.Session

	eventsMu sync.Mutex
	events   []qmp.Event // the last few, for diagnostics

	exitErr error // set before done is closed (started VMs only)
	started bool  // started by us (not adopted)

	// A cold boot of our guests (kernel and initramfs, not restored from
	// a template) is measured once, at its first ready guest agent, to
	// derive later boots' budgets (boottime.go).
	coldBoot        bool
	startContention float64
	bootMeasured    bool
}

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Start starts a VM and returns once QEMU answers on QMP. The guest is
// not ready yet: see WaitReady.
func Start(ctx context.Context, s Spec) (_ *VM, err error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.Accel == "" {
		s.Accel, _ = DetectAccel(s.QEMU, s.Guest.Kernel)
	}
	// Root's alone: QEMU opens what it needs before -runas drops its
	// privileges, and later gets files as descriptors (Screenshot).
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, errdefs.Conflictf("vm %s: state directory %s exists", s.ID, s.Dir)
		}
		return nil, err
	}
	if err := os.Chmod(s.Dir, 0o700); err != nil { // whatever the umask
		return nil, err
	}
	v := &VM{dir: s.Dir, done: make(chan struct{}), started: true,
		coldBoot: s.Guest.Kernel != "" && s.FromTemplate == "", startContention: HostContention()}
	v.rec = record{ID: s.ID, Accel: s.Accel, Cgroup: s.Cgroup, Started: time.Now().UTC()}
	defer func() {
		if err != nil {
			_ = v.destroy(context.WithoutCancel(ctx), false)
		}
	}()
	if err := s.prepareDisks(ctx); err != nil {
		return nil, err
	}
	if s.RunAs != "" {
		if _, err := user.Lookup(s.RunAs); err != nil {
			return nil, errdefs.Invalidf("run_as: %v", err)
		}
	}
	if s.TPM {
		if err := v.startTPM(ctx, s); err != nil {
			return nil, err
		}
	}
	args := s.args()
	v.rec.Args = args
	logf, err := os.OpenFile(filepath.Join(s.Dir, qemuLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(s.QEMU, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own session: QEMU outlives the daemon (it is adopted after a
	// restart) and signals to the daemon's process group miss it. Without
	// the daemon's marker, so a restarting daemon does not end it as a
	// leftover (pkg/lifetime).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = lifetime.Unmarked(os.Environ())
	if err := cmd.Start(); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "start %s", s.QEMU)
	}
	v.rec.PID = cmd.Process.Pid
	go func() {
		v.exitErr = cmd.Wait()
		close(v.done)
	}()
	if v.rec.StartTime, err = procStartTime(v.rec.PID); err != nil {
		return nil, err
	}
	// The record first: whoever finds the directory after a crash (Remove)
	// must be able to find the process.
	if err := v.writeRecord(); err != nil {
		return nil, err
	}
	if s.Cgroup != "" {
		if err := placeInCgroup(s.Cgroup, v.rec.PID, s.MemoryMiB, s.CPUs); err != nil {
			return nil, err
		}
	}
	v.mon = newMonitor(filepath.Join(s.Dir, qmpSocket), scaled(qmpCallBase), v.onEvent)
	if err := v.waitQMP(ctx); err != nil {
		return nil, err
	}
	return v, nil
}

func (s *Spec) validate() error {
	if !idRE.MatchString(s.ID) {
		return errdefs.Invalidf("id: %q must be lower-case letters, digits and '-'", s.ID)
	}
	if s.Guest == nil {
		return errdefs.Invalidf("guest: required")
	}
	if !filepath.IsAbs(s.Dir) {
		return errdefs.Invalidf("dir: %q is not absolute", s.Dir)
	}
	if n := len(filepath.Join(s.Dir, qmpSocket)); n > 107 {
		return errdefs.Invalidf("dir: %q is too long for unix sockets (%d > 107 bytes)", s.Dir, n)
	}
	if s.QEMU == "" {
		s.QEMU = DefaultQEMU
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = DefaultMemoryMiB
	}
	if s.CPUs == 0 {
		s.CPUs = DefaultCPUs
	}
	switch {
	case s.MemoryMiB < 128:
		return errdefs.Invalidf("memory_mib: %d is below 128", s.MemoryMiB)
	case s.CPUs < 1 || s.CPUs > 64:
		return errdefs.Invalidf("cpus: %d is not between 1 and 64", s.CPUs)
	case s.Accel != "" && s.Accel != AccelKVM && s.Accel != AccelTCG:
		return errdefs.Invalidf("accel: %q is not kvm or tcg", s.Accel)
	case strings.ContainsAny(s.KernelArgs, "\n\x00"):
		return errdefs.Invalidf("kernel_args: contains a newline or NUL")
	}
	for i, d := range s.DataDisks {
		// QEMU's option syntax: a comma would start another option.
		if !filepath.IsAbs(d) || strings.ContainsAny(d, ",\n\x00") {
			return errdefs.Invalidf("data_disks[%d]: %q must be an absolute path without commas", i, d)
		}
	}
	return nil
}

// prepareDisks makes the overlay (fresh, or a copy of the template), the
// firmware variables and the screenshot directory.
func (s *Spec) prepareDisks(ctx context.Context) error {
	ov := filepath.Join(s.Dir, overlay)
	if s.FromTemplate != "" {
		if err := copyFile(s.FromTemplate, ov); err != nil {
			return fmt.Errorf("copy template: %w", err)
		}
	} else if err := run(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-b", s.Guest.Disk, "-F", "qcow2", ov); err != nil {
		return err
	}
	if s.Firmware != nil {
		if err := run(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", s.Firmware.Vars, filepath.Join(s.Dir, varsFile)); err != nil {
			return err
		}
	}
	return os.Mkdir(filepath.Join(s.Dir, shotsDir), 0o700)
}

// args is QEMU's command line. Everything a snapshot depends on (machine,
// memory, CPUs, devices) is derived from the spec alone, so that a VM
// started from a template matches the VM the template was saved from.
func (s *Spec) args() []string {
	d := s.Dir
	machine := "q35"
	if s.Firmware != nil && s.Firmware.SecureBoot {
		machine += ",smm=on"
	}
	accel := s.Accel
	cpu := "max"
	if accel == AccelTCG {
		accel += fmt.Sprintf(",tb-size=%d", tcgCacheMiB)
	} else {
		cpu = "host"
	}
	a := []string{
		"-name", s.ID + ",debug-threads=on",
		"-machine", machine, "-accel", accel, "-cpu", cpu,
		"-m", strconv.Itoa(s.MemoryMiB), "-smp", strconv.Itoa(s.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none",
		"-sandbox", s.sandboxOpt(),
		"-qmp", "unix:" + filepath.Join(d, qmpSocket) + ",server=on,wait=off",
		"-chardev", "file,id=console,path=" + filepath.Join(d, consoleLog),
		"-serial", "chardev:console",
		"-device", "VGA",
		"-blockdev", "driver=file,filename=" + filepath.Join(d, overlay) + ",node-name=file0",
		"-blockdev", "driver=qcow2,file=file0,node-name=disk0",
		"-device", "virtio-blk-pci,drive=disk0",
		"-chardev", "socket,id=qga0,path=" + filepath.Join(d, qgaSocket) + ",server=on,wait=off",
		"-device", "virtio-serial-pci",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
	}
	if s.Guest.Kernel != "" {
		// Our guests: the sandbox-agent's port, and a kernel panic
		// (panic=-1) or reboot ends QEMU. A disk guest (an administrator's
		// image) has no sandbox-agent, so it gets no agent port (its
		// guest sees only qemu-ga's), and may reboot (Windows does, after
		// updates) without ending the VM.
		a = append(a, "-no-reboot",
			"-chardev", "socket,id=agent0,path="+filepath.Join(d, agentSock)+",server=on,wait=off",
			"-device", "virtserialport,chardev=agent0,name="+vport.AgentPortName)
	}
	for i, disk := range s.DataDisks {
		a = append(a,
			"-blockdev", fmt.Sprintf("driver=file,filename=%s,node-name=file%d", disk, i+1),
			"-blockdev", fmt.Sprintf("driver=raw,file=file%d,node-name=disk%d", i+1, i+1),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=disk%d", i+1))
	}
	if s.Guest.Kernel != "" {
		a = append(a, "-kernel", s.Guest.Kernel, "-initrd", s.Guest.Initrd,
			"-append", strings.TrimSpace("console=ttyS0 console=tty0 panic=-1 quiet "+SlowHostKernelArgs(s.Accel)+" "+s.KernelArgs))
	}
	if s.Firmware != nil {
		if s.Firmware.SecureBoot {
			a = append(a, "-global", "driver=cfi.pflash01,property=secure,value=on",
				"-global", "ICH9-LPC.disable_s3=1")
		}
		a = append(a,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+s.Firmware.Code,
			"-drive", "if=pflash,format=qcow2,unit=1,file="+filepath.Join(d, varsFile))
	}
	if s.TPM {
		a = append(a, "-chardev", "socket,id=chrtpm,path="+filepath.Join(d, tpmSocket),
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
	}
	if s.FromTemplate != "" {
		a = append(a, "-loadvm", ReadySnapshot)
	}
	if s.RunAs != "" {
		a = append(a, "-runas", s.RunAs)
	}
	return a
}

// SlowHostKernelArgs are the guest kernel parameters that let a Linux
// guest boot however late its vCPU and QEMU's timers run: on a host whose
// CPUs are saturated a TCG guest's kernel otherwise dies in its timer
// check ("..MP-BIOS bug: 8254 timer not connected to IO-APIC", then
// "IO-APIC + timer doesn't work!"). Each is chosen for a reason:
//
//   - no_timer_check: the kernel's check_timer() busy-waits a fixed number
//     of TSC cycles (about 70 ms on this host) and requires four jiffies
//     to have passed. Under TCG the TSC is the host's and runs on while
//     QEMU's main loop, which fires the emulated PIT, waits for a CPU; the
//     ticks it misses are dropped, not queued, so on a busy host the check
//     fails and the kernel panics although the timer works. KVM guests
//     skip the check by themselves (kvm_guest_init); ours skip it always.
//   - tsc=reliable (TCG only): TCG's TSC is the host's counter
//     (cpu_get_host_ticks, kept monotonic by QEMU), at the host's
//     invariant rate; the clocksource watchdog that compares it with the
//     HPET would see only scheduling delays on a busy host, mark the TSC
//     unstable and move the guest to the HPET, every read of which is an
//     emulated MMIO access — slower still. Under KVM the guest picks
//     kvm-clock or a stable TSC itself and the watchdog stays.
//   - noapictimer (TCG only): TCG offers no TSC-deadline timer, so the
//     guest would calibrate its local APIC timer against PIT ticks for
//     100 ms and verify it for another 100 ms: on a busy host the
//     calibration is skewed by late ticks and the verification fails (the
//     kernel then falls back to the broadcast it uses here from the
//     start). Without it the HPET, which QEMU drives from its real-time
//     clock, is the tick device. Under KVM the TSC-deadline timer needs
//     no calibration and stays.
//
// Not chosen: lpj= (the delay loop is not calibrated anyway: with a TSC the
// kernel derives loops_per_jiffy from the TSC's frequency, measured against
// the PIT/HPET/PM timer, all real-time clocks in QEMU), tsc_early_khz= (the
// host's TSC frequency is not published to user space), clocksource= (TSC
// is the highest-rated one left once it is reliable), -no-hpet (the HPET
// is the tick device here).
func SlowHostKernelArgs(accel string) string {
	if accel == AccelKVM {
		return "no_timer_check"
	}
	return "no_timer_check tsc=reliable noapictimer"
}

// sandboxOpt is QEMU's own seccomp filter: no spawning, no obsolete or
// resource-control syscalls, no set*id. QEMU 7.2 installs the filter
// before it switches to the -runas user, so with RunAs the set*id calls
// must stay allowed for that switch; afterwards every id is the
// unprivileged user's and no capability is left, so they can only keep
// the process where it is.
func (s *Spec) sandboxOpt() string {
	elevate := "deny"
	if s.RunAs != "" {
		elevate = "allow"
	}
	return "on,obsolete=deny,elevateprivileges=" + elevate + ",spawn=deny,resourcecontrol=deny"
}

// startTPM starts swtpm for the VM; it exits when QEMU disconnects.
func (v *VM) startTPM(ctx context.Context, s Spec) error {
	state := filepath.Join(s.Dir, tpmDir)
	if err := os.Mkdir(state, 0o700); err != nil {
		return err
	}
	sock := filepath.Join(s.Dir, tpmSocket)
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state,
		"--ctrl", "type=unixio,path="+sock, "--terminate", "--log", "file="+filepath.Join(s.Dir, "swtpm.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives the daemon, as QEMU
	cmd.Env = lifetime.Unmarked(os.Environ())
	if err := cmd.Start(); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "start swtpm (package swtpm)")
	}
	v.rec.TPMPID = cmd.Process.Pid
	go func() { _ = cmd.Wait() }()
	st, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		return err
	}
	v.rec.TPMStart = st
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.Unavailablef("swtpm did not create %s", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitQMP waits for QEMU's monitor socket and checks that QMP answers,
// retrying within a bound scaled by the host's contention (QEMU sets up
// its devices, and reads a template's RAM for -loadvm, before its main
// loop answers; on a saturated host that takes many times longer).
func (v *VM) waitQMP(ctx context.Context) error {
	limit := scaled(qmpStartBase)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		_, err := v.mon.run(ctx, "query-status", nil)
		if err == nil {
			return nil
		}
		select {
		case <-v.done:
			return errdefs.Unavailablef("qemu exited at start: %v: %s", v.exitErr, v.tail(qemuLog, 2000))
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.Unavailable, err, "qemu monitor did not answer within %s", limit)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (v *VM) onEvent(e qmp.Event) {
	v.eventsMu.Lock()
	defer v.eventsMu.Unlock()
	v.events = append(v.events, e)
	if len(v.events) > 32 {
		v.events = v.events[len(v.events)-32:]
	}
}

// Events returns the names of the last QMP events seen.
func (v *VM) Events() []string {
	v.eventsMu.Lock()
	defer v.eventsMu.Unlock()
	names := make([]string, len(v.events))
	for i, e := range v.events {
		names[i] = e.Event
	}
	return names
}

// ID, Dir, PID, Accel describe the VM.
func (v *VM) ID() string    { return v.rec.ID }
func (v *VM) Dir() string   { return v.dir }
func (v *VM) PID() int      { return v.rec.PID }
func (v *VM) Accel() string { return v.rec.Accel }

// StartTime is QEMU's start time in clock ticks since boot
// (/proc/<pid>/stat field 22): with the pid, its identity.
func (v *VM) StartTime() uint64 { return v.rec.StartTime }

// ExitDescription says how QEMU ended once Done is closed ("" if unknown:
// an adopted QEMU is not our child, so its status is not ours to read).
func (v *VM) ExitDescription() string {
	if !isClosed(v.done) || v.exitErr == nil {
		if isClosed(v.done) && v.started {
			return "qemu exited with status 0"
		}
		return ""
	}
	return "qemu: " + v.exitErr.Error()
}

// Done is closed when the QEMU process has exited.
func (v *VM) Done() <-chan struct{} { return v.done }

// Console returns the last max bytes of the serial console.
func (v *VM) Console(max int) string { return v.tail(consoleLog, max) }

func (v *VM) tail(name string, max int) string {
	b, _ := os.ReadFile(filepath.Join(v.dir, name))
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

func (v *VM) writeRecord() error {
	b, _ := json.MarshalIndent(v.rec, "", "  ")
	tmp := filepath.Join(v.dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(v.dir, stateFile))
}

// QGA returns the guest agent client, connecting on first use.
func (v *VM) QGA(ctx context.Context) (*qga.Client, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.qga != nil {
		return v.qga, nil
	}
	c, err := qga.Dial(ctx, filepath.Join(v.dir, qgaSocket))
	if err != nil {
		return nil, err
	}
	v.qga = c
	return c, nil
}

// DialAgent opens a connection to the guest's sandbox-agent (the protocol
// of pkg/agent) over the agent's virtio-serial channel: an agent.Dialer.
func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	v.mu.Lock()
	if v.agent == nil {
		v.agent = vport.NewSession(filepath.Join(v.dir, agentSock))
	}
	s := v.agent
	v.mu.Unlock()
	return s.Dial(ctx)
}

// resetQGA drops the guest-agent and sandbox-agent channels (after a
// restore, or when they broke); they reconnect on next use.
func (v *VM) resetQGA() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.qga != nil {
		v.qga.Close()
		v.qga = nil
	}
	if v.agent != nil {
		v.agent.Close()
		v.agent = nil
	}
}

// WaitReady waits until the guest agent answers guest-sync-delimited,
// as long as ctx allows (callers bound it with BootBudget). Each attempt
// gets longer than the last (1 s doubling up to 16 s): on a saturated
// host a guest agent that is up may take seconds to answer, and an
// attempt cut short every time would never see it. The first ready agent
// of a cold boot is the boot measurement later budgets derive from.
func (v *VM) WaitReady(ctx context.Context) error {
	attempt := time.Second
	for {
		err := func() error {
			c, err := v.QGA(ctx)
			if err != nil {
				return err
			}
			sctx, cancel := context.WithTimeout(ctx, attempt)
			defer cancel()
			return c.Sync(sctx)
		}()
		if err == nil {
			v.measureBoot()
			return nil
		}
		attempt = min(2*attempt, 16*time.Second)
		select {
		case <-v.done:
			return errdefs.Unavailablef("vm %s: qemu exited before the guest was ready; console: %s", v.rec.ID, v.Console(2000))
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "vm %s: guest agent not ready (%v); console: %s", v.rec.ID, err, v.Console(2000))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// measureBoot records the VM's cold boot (Start to the first ready guest
// agent) for BootBudget, once; restored and adopted VMs are not boots.
// The contention recorded is the mean of the start's and the end's.
func (v *VM) measureBoot() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.coldBoot || v.bootMeasured {
		return
	}
	v.bootMeasured = true
	observeBoot(v.rec.Accel, time.Since(v.rec.Started), (v.startContention+HostContention())/2)
}

// Status returns QEMU's run state ("running", "paused", ...).
func (v *VM) Status(ctx context.Context) (string, error) {
	raw, err := v.mon.run(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// Close releases the VM's QMP and guest-agent connections and leaves QEMU
// running: what the daemon does when it shuts down. QEMU serves one client
// per socket, so Adopt can re-attach only after Close (or after the
// process that held the connections died).
func (v *VM) Close() {
	v.resetQGA()
	v.mon.close()
}

// Destroy stops QEMU (QMP quit, then SIGKILL) and swtpm, removes the VM's
// cgroup and its state directory: overlay, sockets, console, screenshots.
func (v *VM) Destroy(ctx context.Context) error { return v.destroy(ctx, true) }

func (v *VM) destroy(ctx context.Context, quit bool) error {
	v.resetQGA()
	var errs []error
	if v.rec.PID != 0 {
		if quit && v.mon != nil {
			qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, _ = v.mon.run(qctx, "quit", nil)
			cancel()
		}
		select {
		case <-v.done:
		case <-time.After(5 * time.Second):
		}
		if !isClosed(v.done) {
			if err := killVerified(v.rec.PID, v.rec.StartTime); err != nil {
				errs = append(errs, err)
			}
			select {
			case <-v.done:
			case <-time.After(10 * time.Second):
				errs = append(errs, fmt.Errorf("qemu pid %d did not exit after SIGKILL", v.rec.PID))
			}
		}
	}
	if v.mon != nil {
		v.mon.close()
	}
	if v.rec.TPMPID != 0 {
		// swtpm exits with QEMU (--terminate); make sure.
		_ = killVerified(v.rec.TPMPID, v.rec.TPMStart)
	}
	if v.rec.Cgroup != "" {
		if err := removeCgroup(v.rec.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(v.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Adopt re-attaches to a VM started by an earlier daemon from its state
// directory: the recorded pid must still be QEMU with the recorded start
// time (pids are reused), and QMP must answer. A VM whose process is gone
// is reported as not_found; the caller then cleans it up with Remove.
func Adopt(ctx context.Context, dir string) (*VM, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.NotFound, err, "vm state in %s", dir)
	}
	v := &VM{dir: dir, done: make(chan struct{})}
	if err := json.Unmarshal(b, &v.rec); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "vm state in %s", dir)
	}
	if st, err := procStartTime(v.rec.PID); err != nil || st != v.rec.StartTime {
		return nil, errdefs.NotFoundf("vm %s: qemu pid %d is gone", v.rec.ID, v.rec.PID)
	}
	// Not our child: watch its exit through a pidfd.
	fd, err := unix.PidfdOpen(v.rec.PID, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.NotFound, err, "vm %s: pidfd", v.rec.ID)
	}
	if st, err := procStartTime(v.rec.PID); err != nil || st != v.rec.StartTime {
		unix.Close(fd)
		return nil, errdefs.NotFoundf("vm %s: qemu pid %d is gone", v.rec.ID, v.rec.PID)
	}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		close(v.done)
	}()
	// QMP is retried while QEMU lives, within a bound scaled by the
	// host's contention: a busy QEMU (or one still noticing that the dead
	// daemon's connection closed: it serves one client at a time) may
	// answer late, and a VM given up here would be released as dead.
	v.mon = newMonitor(filepath.Join(dir, qmpSocket), scaled(qmpCallBase), v.onEvent)
	limit := scaled(qmpStartBase)
	actx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		_, err := v.mon.run(actx, "query-status", nil)
		if err == nil {
			return v, nil
		}
		select {
		case <-v.done:
			v.mon.close()
			return nil, errdefs.NotFoundf("vm %s: qemu pid %d exited", v.rec.ID, v.rec.PID)
		case <-actx.Done():
			v.mon.close()
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm %s: qemu monitor did not answer within %s", v.rec.ID, limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Remove kills the VM whose state directory is dir, if its QEMU (and
// swtpm) still is the recorded process, waits for it to exit and removes
// its cgroup and the directory: the ledger's releaser, for terminate,
// reconciliation and gc. It does not go through QMP, which a live handle
// may hold (QEMU serves one monitor client at a time): the overlay is
// discarded anyway, so SIGKILL loses nothing.
func Remove(ctx context.Context, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var rec record
	if err == nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return fmt.Errorf("vm state in %s: %w", dir, err)
		}
	}
	var errs []error
	for _, p := range []struct {
		pid   int
		start uint64
	}{{rec.PID, rec.StartTime}, {rec.TPMPID, rec.TPMStart}} {
		if err := killVerified(p.pid, p.start); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := waitGone(ctx, p.pid, p.start); err != nil {
			errs = append(errs, err)
		}
	}
	if rec.Cgroup != "" {
		if err := removeCgroup(rec.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitGone waits until pid is no longer the process started at start (it
// exited; a zombie counts as gone: its parent reaps it).
func waitGone(ctx context.Context, pid int, start uint64) error {
	if pid <= 0 {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, err := procStartTime(pid); err != nil || st != start {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pid %d did not exit after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procStartTime reads a process's start time (clock ticks since boot,
// field 22 of /proc/<pid>/stat): with the pid it identifies a process.
func procStartTime(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, errors.New("no pid")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	if f[0] == "Z" {
		return 0, fmt.Errorf("pid %d is a zombie", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// killVerified SIGKILLs pid if it still is the process that started at
// startTime, through a pidfd so that the check and the kill address the
// same process.
func killVerified(pid int, startTime uint64) error {
	if pid <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	if st, err := procStartTime(pid); err != nil || st != startTime {
		return nil // exited (zombie or reused pid)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return nil
}

// copyFile copies src to a new file dst, as a reflink where the file
// system can (a template overlay is mostly the saved RAM image).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}
