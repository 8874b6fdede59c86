package vm

import (
	"fmt"

	occgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
)

// pidsLimit bounds QEMU's threads (vCPUs, I/O workers, RCU, VNC/audio are
// off). QEMU forks nothing under -sandbox spawn=deny.
const pidsLimit = 256

// placeInCgroup creates cgroup path with the VM's limits and moves QEMU
// into it: memory is guest RAM plus QEMU's own overhead, CPU is a quota of
// one core per vCPU. It works on cgroup v1, hybrid and v2 hosts alike
// (opencontainers/cgroups, the library runc uses).
//
// QEMU runs briefly in the daemon's cgroup before it is moved; on v1 the
// few pages it touched by then stay charged there. Guest RAM is allocated
// lazily, when the guest touches it, so it is charged here.
func placeInCgroup(path string, pid, memoryMiB, cpus int) error {
	limit := int64(pidsLimit)
	res := &occgroups.Resources{
		Memory:      int64(memoryMiB+qemuOverheadMiB) << 20,
		CpuQuota:    int64(cpus) * 100000,
		CpuPeriod:   100000,
		PidsLimit:   &limit,
		SkipDevices: true,
	}
	m, err := manager.New(&occgroups.Cgroup{Path: path, Resources: res})
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := m.Apply(pid); err != nil {
		return fmt.Errorf("cgroup %s: add qemu: %w", path, err)
	}
	if err := m.Set(res); err != nil {
		return fmt.Errorf("cgroup %s: limits: %w", path, err)
	}
	return nil
}

// removeCgroup kills what is left in the VM's cgroup and removes it.
func removeCgroup(path string) error {
	if !cgroups.Exists(path) {
		return nil
	}
	return cgroups.Remove(path)
}
