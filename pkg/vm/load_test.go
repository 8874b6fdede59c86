//go:build vmload

package vm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	occgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// loadPerCPU is how many busy loops per CPU the load generator runs.
const loadPerCPU = 4

// startLoad saturates the host's CPUs for the rest of the test: loadPerCPU
// busy-loop processes per CPU in a cgroup of their own, made here and
// removed (processes killed first) when the test ends. The cgroup weighs
// as much as its processes would outside it (CPU shares of 1024 each on
// v1, weight 100 each on v2), so the load is what that many ordinary busy
// processes put on the host, wherever the VMs' cgroups are.
func startLoad(t *testing.T) {
	t.Helper()
	n := loadPerCPU * runtime.NumCPU()
	path := "/mcp-sandboxd-load-" + testenv.RandHex(4)
	res := &occgroups.Resources{SkipDevices: true}
	if cgroups.HostMode() == cgroups.ModeUnified {
		res.CpuWeight = uint64(min(100*n, 10000))
	} else {
		res.CpuShares = uint64(1024 * n)
	}
	m, err := manager.New(&occgroups.Cgroup{Path: path, Resources: res})
	if err != nil {
		t.Fatal(err)
	}
	// The cgroup is made by the first Apply; remove it whatever happens
	// after.
	t.Cleanup(func() {
		if err := cgroups.Remove(path); err != nil {
			t.Errorf("remove load cgroup %s: %v", path, err)
		}
	})
	var cmds []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	for i := range n {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		if err := m.Apply(c.Process.Pid); err != nil {
			t.Fatalf("load %d into %s: %v", i, path, err)
		}
		if i == 0 {
			if err := m.Set(res); err != nil {
				t.Fatalf("load cgroup %s: %v", path, err)
			}
		}
	}
	procs, err := cgroups.Procs(path)
	if err != nil || len(procs) != n {
		t.Fatalf("load cgroup %s holds %d processes (%v), want %d", path, len(procs), err, n)
	}
	t.Logf("load: %d busy loops in %s", n, path)
}

// TestBootUnderLoad boots VMs one after another (cold boots of the test
// guest, kernel and initramfs: what the kernel's timer check runs in)
// while the host's CPUs are saturated by a load generator, and requires
// every one to reach a ready guest agent within its derived budget
// (vm.BootBudget). Before the slow-host kernel parameters
// (vm.SlowHostKernelArgs) a TCG guest died here in its timer check
// ("..MP-BIOS bug: 8254 timer not connected to IO-APIC"). make
// test-vm-load runs it (VM_LOAD_BOOTS boots, default 10).
func TestBootUnderLoad(t *testing.T) {
	testenv.RequireRoot(t)
	g := vmenv.Guest(t)
	n := 10
	if s := os.Getenv("VM_LOAD_BOOTS"); s != "" {
		if n, _ = strconv.Atoi(s); n < 1 {
			t.Fatalf("VM_LOAD_BOOTS=%q: want a positive count", s)
		}
	}
	startLoad(t)
	var took []time.Duration
	for i := range n {
		s := newSpec(t, g)
		budget := vm.BootBudget(s.Accel)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		t0 := time.Now()
		v, err := vm.Start(ctx, s)
		if err != nil {
			cancel()
			t.Fatalf("boot %d: start: %v", i+1, err)
		}
		err = v.WaitReady(ctx)
		d := time.Since(t0)
		cancel()
		if err != nil {
			t.Fatalf("boot %d: not ready within its budget %v (contention %.1f): %v", i+1, budget, vm.HostContention(), err)
		}
		if cmdline := sh(t, v, "cat /proc/cmdline"); !strings.Contains(string(cmdline.Stdout), vm.SlowHostKernelArgs(v.Accel())) {
			t.Fatalf("boot %d: guest command line %q lacks %q", i+1, cmdline.Stdout, vm.SlowHostKernelArgs(v.Accel()))
		}
		if err := v.Destroy(context.Background()); err != nil {
			t.Fatalf("boot %d: destroy: %v", i+1, err)
		}
		took = append(took, d)
		t.Logf("boot %d/%d ready in %v (budget %v, host contention %.1f runnable per CPU)", i+1, n, d.Round(time.Millisecond), budget, vm.HostContention())
	}
	t.Logf("%d cold boots under load: median %v of %v", n, median(took), fmt.Sprint(took))
}
