package runtime

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestBuildSpec checks the security-relevant parts of the spec a sandbox runs
// with; pkg/engine's tests check what the kernel makes of it.
func TestBuildSpec(t *testing.T) {
	s := BuildSpec(&Spec{
		ID: "sb-0123456789ab", Rootfs: "/run/x/rootfs", CgroupPath: "/mcp-sandboxd/sb-0123456789ab",
		Binds: []Bind{
			{Source: "/run/x/ws", Destination: "/workspace"},
			{Source: "/usr/libexec/agent", Destination: "/.sandboxd/agent", ReadOnly: true},
			{Source: "/run/x/agent", Destination: "/.sandboxd/run", NoExec: true},
		},
		Limits:   Limits{MemoryBytes: 64 << 20, CPUs: 0.5, Pids: 32, IODevice: "8:0", IOReadBPS: 1 << 20},
		InitArgs: []string{"/.sandboxd/agent"},
	})
	if !s.Root.Readonly || s.Root.Path != "/run/x/rootfs" || s.Hostname != "sb-0123456789ab" {
		t.Errorf("root/hostname: %+v %q", s.Root, s.Hostname)
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.MountNamespace, specs.CgroupNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("namespace %s missing: %v", want, ns)
		}
	}
	if slices.Contains(ns, specs.UserNamespace) {
		t.Error("a user namespace was not asked for")
	}
	if !s.Process.NoNewPrivileges || slices.Contains(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") ||
		len(s.Process.Capabilities.Inheritable) > 0 || len(s.Process.Capabilities.Ambient) > 0 {
		t.Errorf("process privileges: %+v", s.Process)
	}
	mounts := map[string][]string{}
	for _, m := range s.Mounts {
		mounts[m.Destination] = m.Options
	}
	if o := mounts["/.sandboxd/agent"]; !slices.Contains(o, "ro") || !slices.Contains(o, "nosuid") {
		t.Errorf("agent mount options %v", o)
	}
	if o := mounts["/.sandboxd/run"]; !slices.Contains(o, "noexec") || !slices.Contains(o, "rw") {
		t.Errorf("agent run dir options %v", o)
	}
	if o := mounts["/workspace"]; !slices.Contains(o, "nodev") || slices.Contains(o, "ro") {
		t.Errorf("workspace options %v", o)
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 64<<20 || *r.CPU.Quota != 50000 || *r.CPU.Period != 100000 || *r.Pids.Limit != 32 {
		t.Errorf("resources %+v %+v %+v", r.Memory, r.CPU, r.Pids)
	}
	if r.Memory.Swap != nil && *r.Memory.Swap != *r.Memory.Limit {
		t.Errorf("swap %d: memory+swap must equal memory (no swap)", *r.Memory.Swap)
	}
	if r.BlockIO == nil || len(r.BlockIO.ThrottleReadBpsDevice) != 1 || r.BlockIO.ThrottleReadBpsDevice[0].Major != 8 {
		t.Errorf("block I/O %+v", r.BlockIO)
	}
	if len(s.Linux.Sysctl) != 0 {
		t.Errorf("sysctls %v, none asked for", s.Linux.Sysctl)
	}
	withSysctl := BuildSpec(&Spec{ID: "sb-0123456789ab", Rootfs: "/r", NetSysctls: map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}})
	if got := withSysctl.Linux.Sysctl; len(got) != 1 || got["net.ipv4.ip_unprivileged_port_start"] != "0" {
		t.Errorf("sysctls %v, want the port start of NetSysctls", got)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Error("runc's masked and read-only paths are missing")
	}
}
