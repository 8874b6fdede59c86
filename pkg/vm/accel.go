package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// Accelerators QEMU can run guests with.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// probeTimeout is how long the probe guest gets: under working KVM the
// kernel prints its banner within a fraction of a second.
const probeTimeout = 6 * time.Second

var probe struct {
	once   sync.Once
	mu     sync.Mutex // guards the fields below for ProbedAccel
	accel  string
	reason string
	done   bool
}

// DetectAccel returns the accelerator to use and why. /dev/kvm opening is
// not enough: on some hosts (nested, restricted containers) the device
// opens and VM creation succeeds but a guest under -accel kvm never runs.
// Nor is a real-mode guest: on the project's build machine a boot sector
// under KVM prints to the serial port while a Linux kernel prints nothing.
// So KVM counts only when the guest kernel, booted under it without a
// root disk, writes its banner to the serial port in time. The result is
// computed once per process.
func DetectAccel(qemu, kernel string) (accel, reason string) {
	probe.once.Do(func() {
		a, r := probeKVM(qemu, kernel)
		probe.mu.Lock()
		probe.accel, probe.reason, probe.done = a, r, true
		probe.mu.Unlock()
	})
	probe.mu.Lock()
	defer probe.mu.Unlock()
	return probe.accel, probe.reason
}

func probeKVM(qemu, kernel string) (string, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, "no /dev/kvm: " + err.Error()
	}
	f.Close()
	dir, err := os.MkdirTemp("", "kvm-probe-")
	if err != nil {
		return AccelTCG, "probe: " + err.Error()
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "serial")
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	// Without a root the kernel panics after its banner; panic=-1 with
	// -no-reboot makes that an exit.
	cmd := exec.CommandContext(ctx, qemu, "-accel", "kvm", "-cpu", "host", "-m", "128M",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", kernel, "-append", "console=ttyS0 earlyprintk=serial panic=-1",
		"-serial", "file:"+out)
	cmd.SysProcAttr = lifetime.DieWithParent()
	if err := cmd.Start(); err != nil {
		return AccelTCG, "probe: " + err.Error()
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-waitErr:
			if b, _ := os.ReadFile(out); bytes.Contains(b, []byte("Linux version")) {
				return AccelKVM, "a probe guest kernel ran under KVM"
			}
			return AccelTCG, "probe guest under KVM exited without output: " + errString(err)
		case <-tick.C:
			if b, _ := os.ReadFile(out); bytes.Contains(b, []byte("Linux version")) {
				_ = cmd.Process.Kill()
				<-waitErr
				return AccelKVM, "a probe guest kernel ran under KVM"
			}
		case <-ctx.Done():
			<-waitErr // CommandContext killed it
			return AccelTCG, "/dev/kvm opens but a probe guest under KVM produced no output in " + probeTimeout.String()
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// ProbedAccel returns the outcome of DetectAccel without probing: done is
// false while no VM of this process has needed the probe yet (readiness
// reports it without paying for a probe boot).
func ProbedAccel() (accel, reason string, done bool) {
	probe.mu.Lock()
	defer probe.mu.Unlock()
	return probe.accel, probe.reason, probe.done
}
