package vm

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// How long a VM may take to come up is derived, not fixed: a guest under
// TCG on a host whose CPUs are saturated boots tens of times slower than
// on a quiet one, and a fixed deadline either fails it there or waits for
// ever on a guest that is really stuck (docs/vm.md "Boot timeouts").
//
// Two measurements feed it:
//
//   - the host's CPU contention, now: runnable tasks per online CPU
//     (/proc/loadavg, the larger of the 1-minute average and the tasks
//     runnable at this instant, so that a sudden burst counts before the
//     average catches up), at least 1. A QEMU vCPU thread competing with
//     N runnable tasks per CPU gets about 1/N of a CPU, so a guest's boot
//     stretches by about that factor.
//   - a boot this process measured: the last cold boot of each
//     accelerator that reached a ready guest agent (WaitReady of a VM
//     Start booted, not restored), with the contention at that time.
//
// The budget of a boot is bootSlack times the reference boot, scaled by
// how much busier the host is now than when the reference was measured,
// within [minBootBudget, maxBootBudget]. Before any boot was measured the
// reference is nominalBoot of the accelerator at contention 1. A deadline
// that is too long costs nothing when the guest is healthy, and a guest
// that dies (kernel panic, failed /init) ends QEMU at once (panic=-1 with
// -no-reboot), which every wait watches: so the slack is generous.
const (
	bootSlack     = 4
	minBootBudget = time.Minute
	maxBootBudget = 15 * time.Minute
	// qmpStartBase is how long QEMU may take on a quiet host to answer on
	// QMP after exec (device setup, and -loadvm of a template's RAM, which
	// QEMU reads before its main loop serves the monitor); scaled by the
	// contention.
	qmpStartBase = 15 * time.Second
	// qmpCallBase bounds one QMP call on a quiet host (savevm/loadvm of a
	// few hundred MiB take about a second, screendump milliseconds);
	// scaled by the contention at connect.
	qmpCallBase = 30 * time.Second
	// maxScale caps the contention factor applied to fixed bases: past
	// it, a deadline is no longer a deadline.
	maxScale = 20
)

// nominalBoot is a cold boot to a ready guest agent on a quiet host, per
// accelerator (measured: docs/vm.md "Figures"; TCG 6.8 s quiet, KVM well
// under 2 s), used until this process has measured one.
var nominalBoot = map[string]time.Duration{AccelTCG: 10 * time.Second, AccelKVM: 3 * time.Second}

type bootSample struct {
	took       time.Duration
	contention float64
}

var boots struct {
	mu   sync.Mutex
	last map[string]bootSample // by accelerator
}

// observeBoot records a cold boot of accel that reached a ready guest in
// took, measured while the host's contention was contention.
func observeBoot(accel string, took time.Duration, contention float64) {
	boots.mu.Lock()
	defer boots.mu.Unlock()
	if boots.last == nil {
		boots.last = map[string]bootSample{}
	}
	boots.last[accel] = bootSample{took: took, contention: max(contention, 1)}
}

// BootBudget is how long a cold boot of a guest under accel (AccelTCG,
// AccelKVM; "" counts as TCG, the slower) may take to reach a ready guest
// agent on this host now: see the comment at the top of this file.
func BootBudget(accel string) time.Duration {
	return bootBudget(accel, HostContention())
}

func bootBudget(accel string, now float64) time.Duration {
	if accel != AccelKVM {
		accel = AccelTCG
	}
	boots.mu.Lock()
	ref, ok := boots.last[accel]
	boots.mu.Unlock()
	if !ok {
		ref = bootSample{took: nominalBoot[accel], contention: 1}
	}
	d := time.Duration(float64(bootSlack*ref.took) * max(now, 1) / ref.contention)
	return min(max(d, minBootBudget), maxBootBudget)
}

// scaled is base stretched by the host's contention now, at most maxScale
// times: for waits on QEMU itself (its start, a QMP call), which need CPU
// as a boot does.
func scaled(base time.Duration) time.Duration {
	return time.Duration(float64(base) * min(HostContention(), maxScale))
}

// HostContention is the host's runnable tasks per online CPU, at least 1
// (1 on a host with CPU to spare). It reads /proc/loadavg: the 1-minute
// load average and the tasks runnable now (the fourth field's numerator,
// which counts the reader itself, hence the minus one), whichever is
// larger, divided by the CPUs this process may run on.
func HostContention() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	return contentionOf(string(b), runtime.NumCPU())
}

func contentionOf(loadavg string, cpus int) float64 {
	f := strings.Fields(loadavg)
	if len(f) < 4 || cpus < 1 {
		return 1
	}
	load, _ := strconv.ParseFloat(f[0], 64)
	if running, _, ok := strings.Cut(f[3], "/"); ok {
		if n, err := strconv.Atoi(running); err == nil {
			load = max(load, float64(n-1))
		}
	}
	return max(load/float64(cpus), 1)
}
