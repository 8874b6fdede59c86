// Package runtime runs sandboxes as containers through runc's libcontainer,
// in-process: it turns a sandbox description into an OCI runtime spec, then a
// libcontainer config, starts the sandbox's PID 1 (sandbox-agent) and tears
// everything down again.
//
// Security boundaries enforced here (each one tested in pkg/engine):
//   - namespaces: mount, PID, IPC, UTS, network (loopback only unless a
//     network is attached later) and cgroup; the host's processes, hostname
//     and cgroup tree are invisible;
//   - the image rootfs is mounted read-only; only /workspace and /tmp (on the
//     sandbox's size-limited tmpfs) and the agent's socket directory are writable;
//   - runc's masked and read-only /proc and /sys paths, a minimal /dev;
//   - no_new_privs, a seccomp filter, and a capability set per mode
//     (AgentCapabilities, RootModeCapabilities): in normal mode what the
//     agent needs to start commands as the sandbox user, signal them and act
//     as that user in the file API, and the commands have none at all (not
//     even a bounding set); in root mode what root of a container needs to
//     install packages;
//   - cgroup limits (memory without swap, CPU quota, pids, block I/O) at an
//     absolute path under the daemon's cgroup parent.
//
// libcontainer re-executes the calling binary with the argument "init" to set
// up each container; every binary that imports this package must call
// MaybeInit first thing (the daemon's main package does it in init()).
package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	goruntime "runtime"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // device rules for v1 and v2 (required since runc 1.2)
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // cgo constructor that runs before the Go runtime in "init"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/fdwatch"
)

// init keeps the main goroutine on the main thread for the life of the
// process, so that no other goroutine ever runs there. libcontainer starts
// each container with a goroutine that locks its thread, setns(2)s into the
// new container's mount namespace and returns without unlocking, so that Go
// kills the thread. Go cannot kill the main thread: it parks it instead,
// still in the container's mount namespace, which then pins every mount of
// that sandbox (its tmpfs, its ext4 and loop device) until the daemon exits.
func init() { goruntime.LockOSThread() }

// MaybeInit turns the current process into a container's init when
// libcontainer re-executed it for that purpose, and never returns then.
// Otherwise it returns at once. The environment guard makes sure a user typing
// "mcp-sandboxd init" cannot trigger it.
func MaybeInit() {
	if len(os.Args) > 1 && os.Args[1] == "init" && os.Getenv("_LIBCONTAINER_INITPIPE") != "" {
		libcontainer.Init() // never returns
	}
}

// Capabilities of a sandbox, per mode. Security boundary: with a user
// namespace (pkg/userns) every capability below is the sandbox's own
// namespace's only — over its own files, processes and mounts, never the
// host's; without one (sandbox.userns_pool.count 0, normal mode only) they
// are host capabilities confined by the PID, mount and network namespaces,
// which is why the normal-mode set is kept to what the agent itself uses.
//
// The set is given to PID 1 (the agent) as its bounding, permitted and
// effective set alike: the agent runs as uid 0, and an execve by uid 0
// recomputes the effective set as the permitted one and the permitted set
// as the bounding set limited (no_new_privs) by the permitted set before.
// A narrower effective or permitted set in the runtime spec would not
// survive the exec of the agent, and whatever the agent lacks in its
// permitted set its job-exec helpers (the agent binary again, exec'd as
// uid 0: pkg/agent/server/jobexec.go) and so its root-mode jobs lack too.
// So the bounding set is both what the agent holds and the most a job may
// ever have; the helper narrows it further for jobs of normal mode.
// The agent drops nothing itself after its start: none of these is used
// only during setup (in root mode its file API acts as root with the set).
//
// Normal mode (jobs run as the sandbox user, uid 1000): AgentCapabilities.
// Jobs get none at all — the helper drops the whole bounding set and the
// ambient set before it switches to the job's uid, which clears the
// permitted and effective sets; no_new_privs (set for PID 1, inherited)
// keeps setuid binaries and file capabilities from giving any back.
//
// Root mode (jobs run as uid 0 of the namespace, for apt-get install):
// RootModeCapabilities, held by the agent and by every job alike. The
// agent is then no boundary against the jobs (they are root of the same
// namespace); the boundary is the user namespace and this set.
//
// The seccomp profile is resolved for the mode's set (pkg/seccomp: Docker
// profiles allow some syscalls only to holders of a capability, e.g.
// chroot to CAP_SYS_CHROOT).
//
// AgentCapabilities is the normal-mode set; each entry is used by the agent:
//   - CAP_SETUID, CAP_SETGID: the job-exec helper and the spare switch to the
//     job's uid, gid and groups (setgroups, setgid, setuid); the file API
//     acts with the sandbox user's credentials (setfsuid, setfsgid and
//     setgroups on one thread, pkg/agent/server/files.go).
//   - CAP_KILL: signals to jobs, which run as another uid than the agent
//     (kill and signal requests, the session sweep of proc.go, the v1
//     freezer kill); v2's cgroup.kill would need none.
//   - CAP_SETPCAP: the helper drops the job's bounding set (PR_CAPBSET_DROP).
//
// Not in the set, because nothing of the agent needs it (each was in the
// set before and is covered by the tests of pkg/engine and test/adversarial):
// CAP_CHOWN, CAP_FOWNER (the file API gives files to the sandbox user by
// creating them with its fsuid, not by chown; in normal mode it never
// chowns), CAP_DAC_OVERRIDE (the agent owns what it writes: its socket
// directory and the delegated cgroup files are its uid's; the job's
// oom_score_adj is written by the job's own helper; the working directory
// is entered after the switch to the job's uid). Nor CAP_SYS_RESOURCE: the
// agent only lowers rlimits (--nofile), which needs none.
var AgentCapabilities = []string{
	"CAP_KILL", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID",
}

// RootModeCapabilities is the root-mode set: Docker's default set for root
// in a container minus what the sandbox forbids. In it:
//   - CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID: dpkg unpacks files
//     with their owners and modes, setuid/setgid bits included, into
//     directories of any owner.
//   - CAP_SETUID, CAP_SETGID: apt drops to the _apt user for downloads; su,
//     runuser and daemons that switch users; the job-exec helper.
//   - CAP_KILL: apt and service scripts signal processes of other uids (its
//     _apt methods).
//   - CAP_SETPCAP: lets a job only lower its own capabilities or move them
//     to its inheritable set (tools such as setpriv, capsh); it can raise
//     nothing beyond this set.
//   - CAP_NET_BIND_SERVICE: kept from Docker's set, for programs that
//     check for it before binding a port below 1024; the binding itself
//     needs no capability in any mode, since every sandbox's network
//     namespace has ip_unprivileged_port_start 0 (network.SandboxSysctls).
//     Alone it would work only where the namespace belongs to the
//     sandbox's user namespace (a sandbox without network), not in the
//     one pkg/network makes, owned by the host's user namespace.
//   - CAP_SYS_CHROOT: chroot inside the sandbox's own mount namespace (build
//     tools, debootstrap-like scripts); the process's root stays below the
//     sandbox's pivoted root, so ".." cannot leave it.
//
// Left out of Docker's default set:
//   - CAP_MKNOD: device nodes are refused (the adversarial suite checks it;
//     in a user namespace the kernel refuses them anyway, but that should
//     not be the only fence).
//   - CAP_NET_RAW: raw and packet sockets could forge addresses and frames
//     on the sandbox's network (the adversarial suite checks it).
//   - CAP_SETFCAP: file capabilities are inert under no_new_privs (no exec
//     in the sandbox gains them), so setting them buys nothing; Debian's
//     maintainer scripts that call setcap fall back to setuid bits.
//   - CAP_AUDIT_WRITE: the kernel refuses audit messages from a non-initial
//     user namespace whatever the capabilities, so it would buy nothing.
var RootModeCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_NET_BIND_SERVICE", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

// Capabilities returns the capability set of a sandbox's PID 1 in root
// mode or in normal mode (see AgentCapabilities).
func Capabilities(rootMode bool) []string {
	if rootMode {
		return RootModeCapabilities
	}
	return AgentCapabilities
}

// NofileLimit is RLIMIT_NOFILE of every sandbox process.
const NofileLimit = 4096

// Limits are the cgroup limits of one sandbox. Zero means unlimited.
type Limits struct {
	MemoryBytes int64   // memory limit; swap is not allowed on top of it
	CPUs        float64 // CPU quota in cores (0.5 = half a core)
	Pids        int64   // maximum number of tasks
	IOReadBPS   uint64  // block I/O read throttle on IODevice, bytes/s
	IOWriteBPS  uint64  // block I/O write throttle on IODevice, bytes/s
	IODevice    string  // "major:minor" of the throttled block device
}

// Bind is a bind mount from the host into the sandbox.
type Bind struct {
	Source      string // host path
	Destination string // path inside the sandbox
	ReadOnly    bool
	NoExec      bool
}

// Spec describes one sandbox to start.
type Spec struct {
	ID         string // libcontainer id; also the hostname
	Rootfs     string // host path of the sandbox's root (the overlay's merged dir)
	Binds      []Bind
	CgroupPath string // absolute cgroup path
	Limits     Limits
	Seccomp    *specs.LinuxSeccomp // nil: unconfined (must be explicit in config)
	InitArgs   []string            // PID 1's argv, inside the sandbox
	InitEnv    []string
	InitLog    string // host file receiving PID 1's stdout and stderr
	Labels     map[string]string
	// NetNSPath is a network namespace to join (a bind-mounted nsfs file);
	// empty gives the sandbox a new namespace with only loopback.
	NetNSPath string
	// NetSysctls are written by the sandbox's init into its network
	// namespace (the spec's linux.sysctl, net.* names). The init is root
	// of the sandbox's user namespace, so they can be set only in a
	// namespace that user namespace owns: the new one made when NetNSPath
	// is empty. A joined namespace gets its sysctls from its maker
	// (pkg/network); see network.SandboxSysctls for what is set and why.
	NetSysctls map[string]string
	// UsernsPath is the sandbox's own user namespace to join (a pinned
	// nsfs file, pkg/userns: owned by the sandbox's host uid, with its id
	// range mapped); empty keeps the sandbox in the host's, as host root.
	UsernsPath string
	// SysfsPath, if set, is a sysfs the caller mounted for the sandbox's
	// network namespace, bound read-only at /sys instead of a new sysfs
	// mount: a sandbox in its own user namespace that joins a network
	// namespace it does not own may not mount sysfs itself.
	SysfsPath string
	// WritableRoot mounts Rootfs read-write (root mode: apt-get install);
	// writes land in the sandbox's upper layer, on its own disk.
	WritableRoot bool
	// Capabilities is PID 1's capability set, Capabilities(rootMode);
	// nil means AgentCapabilities (normal mode).
	Capabilities []string
	// InitFiles are handed to PID 1 as descriptors 3, 4, ... (the agent's
	// listening socket, bound by the daemon before the start).
	InitFiles []*os.File
}

// Runtime starts and stops sandboxes, keeping libcontainer's state under Root
// (on tmpfs, so a reboot forgets containers that no longer exist).
type Runtime struct {
	Root string
	log  *slog.Logger

	mu        sync.Mutex
	instances map[string]*Instance
	rules     ruleLists
	// initExe is the sealed memfd copy of sandbox-init that each
	// container's `runc init` hands over to (initexec.go); nil until
	// UseInitBinary, and then inits run as the daemon itself.
	initExe *os.File
}

// UseInitBinary makes containers started from now on run sandbox-init (at
// path) as their `runc init` instead of the daemon itself: it copies the
// binary into a sealed memfd once, which every start passes to its child
// (initexec.go). On error the runtime goes on with the daemon's own init.
func (r *Runtime) UseInitBinary(path string) error {
	f, err := sealInitBinary(path, r.Root)
	if err != nil {
		return fmt.Errorf("seal %s: %w", path, err)
	}
	r.mu.Lock()
	old := r.initExe
	r.initExe = f
	r.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Close releases the sealed sandbox-init copy. Containers already started
// are not affected; Start must not be called afterwards.
func (r *Runtime) Close() {
	r.mu.Lock()
	f := r.initExe
	r.initExe = nil
	r.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// New returns a Runtime whose libcontainer state lives in root.
func New(root string, log *slog.Logger) (*Runtime, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("runtime state root %q is not absolute", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create runtime state root: %w", err)
	}
	routeLogrus(log)
	return &Runtime{Root: root, log: log, instances: map[string]*Instance{}}, nil
}

// Instance is a started (or adopted) sandbox init process.
type Instance struct {
	ID        string
	Pid       int
	StartTime uint64 // of the init process, in clock ticks since boot (detects PID reuse)
	Cgroups   map[string]string

	// A sandbox started here keeps none of libcontainer's objects once
	// its init runs: the container, its init's process and the
	// configuration they hold were most of the daemon's retained heap per
	// live sandbox (a heap profile at 60 live: 10.8 of 15.7 KiB), doubled
	// in RSS by the collector's headroom. What terminate and pause need
	// is init's pid (our unreaped child, so not recycled) and a cgroup
	// manager over the paths it runs in; an adopted sandbox, not our
	// child, keeps the container loaded from its state.
	ct *libcontainer.Container // adopted only
	cg cgroups.Manager         // started here only

	// reapMu orders a signal to init (kill) before its reaping: once
	// reaped, its pid may be another process's.
	reapMu sync.Mutex
	reaped bool

	done   chan struct{}
	exitMu sync.Mutex
	exit   string   // how init ended, once done is closed
	onExit []func() // run once done is closed (OnExit)
	exited bool     // done is closed: OnExit runs its function at once
}

// OnExit runs f once the sandbox's init has exited, after Done is closed,
// in a goroutine of its own; at once (in a new goroutine) if it has exited
// already. It lets the owner of a sandbox react to its init's death
// without a goroutine of its own parked on Done for the sandbox's whole
// life.
func (i *Instance) OnExit(f func()) {
	i.exitMu.Lock()
	if !i.exited {
		i.onExit = append(i.onExit, f)
		i.exitMu.Unlock()
		return
	}
	i.exitMu.Unlock()
	go f()
}

// finish records how init ended, closes done and runs the OnExit
// functions (in the calling goroutine, which the exit started).
func (i *Instance) finish(exit string) {
	i.exitMu.Lock()
	if exit != "" {
		i.exit = exit
	}
	i.exited = true
	fs := i.onExit
	i.onExit = nil
	close(i.done)
	i.exitMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Done is closed when the sandbox's init process has exited.
func (i *Instance) Done() <-chan struct{} { return i.done }

// ExitDescription says how init ended ("exit status 1", "signal: killed"),
// valid once Done is closed; empty when unknown (adopted instances).
func (i *Instance) ExitDescription() string {
	i.exitMu.Lock()
	defer i.exitMu.Unlock()
	return i.exit
}

// BuildSpec converts s into the OCI runtime spec libcontainer will run. It is
// exported so the benchmark can hand the same spec to the runc CLI.
func BuildSpec(s *Spec) *specs.Spec {
	spec := buildSpec(s)
	if specMountsFor != nil {
		spec.Mounts = append(spec.Mounts, specMountsFor(s)...)
	}
	return spec
}

// buildSpec is BuildSpec without a testing build's extra mounts: the spec
// LandlockPaths declares.
func buildSpec(s *Spec) *specs.Spec {
	spec := specconv.Example()
	spec.Root = &specs.Root{Path: s.Rootfs, Readonly: !s.WritableRoot}
	spec.Hostname = s.ID
	caps := s.Capabilities
	if caps == nil {
		caps = AgentCapabilities
	}
	caps = append([]string(nil), caps...)
	spec.Process = &specs.Process{
		Args:            s.InitArgs,
		Env:             s.InitEnv,
		Cwd:             "/",
		NoNewPrivileges: true,
		Capabilities: &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps,
		},
		Rlimits: []specs.POSIXRlimit{
			{Type: "RLIMIT_NOFILE", Hard: 4096, Soft: 4096},
			{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
		},
	}
	spec.Mounts = specMounts(spec.Mounts, s)
	// runc's current default masks (Example's list predates some of them).
	spec.Linux.MaskedPaths = append(spec.Linux.MaskedPaths,
		"/proc/interrupts", "/proc/sched_debug", "/sys/devices/virtual/powercap", "/proc/kallsyms")
	spec.Linux.CgroupsPath = s.CgroupPath
	spec.Linux.Namespaces = specNamespaces(spec.Linux.Namespaces, s)
	if len(s.NetSysctls) > 0 {
		spec.Linux.Sysctl = maps.Clone(s.NetSysctls)
	}
	spec.Linux.Resources.Memory, spec.Linux.Resources.CPU, spec.Linux.Resources.Pids = resources(s.Limits)
	spec.Linux.Resources.BlockIO = blockIO(s.Limits)
	spec.Linux.Seccomp = s.Seccomp
	if len(s.Labels) > 0 {
		spec.Annotations = s.Labels
	}
	return spec
}

// specMounts adds the sandbox's binds to the example's mounts and, in a
// network namespace of its own, replaces /sys with that namespace's.
func specMounts(mounts []specs.Mount, s *Spec) []specs.Mount {
	for _, b := range s.Binds {
		opts := []string{"rbind", "nosuid", "nodev"}
		if b.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		if b.NoExec {
			opts = append(opts, "noexec")
		}
		mounts = append(mounts, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source, Options: opts})
	}
	if s.SysfsPath != "" {
		for i, m := range mounts {
			if m.Destination == "/sys" {
				mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: s.SysfsPath,
					Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
			}
		}
	}
	return mounts
}

// specNamespaces joins the network and user namespaces made for the
// sandbox (when it has them) and makes sure of a cgroup namespace.
func specNamespaces(nss []specs.LinuxNamespace, s *Spec) []specs.LinuxNamespace {
	hasCgroupNS := false
	for i, ns := range nss {
		if ns.Type == specs.NetworkNamespace && s.NetNSPath != "" {
			nss[i].Path = s.NetNSPath
		}
		hasCgroupNS = hasCgroupNS || ns.Type == specs.CgroupNamespace
	}
	if !hasCgroupNS {
		// specconv.Example adds it only on unified hosts; on v1/hybrid we want
		// the sandbox to see its own cgroup as "/" too.
		nss = append(nss, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	if s.UsernsPath != "" {
		// Everything in the sandbox, init included, runs as ids of its
		// range; the capabilities below are the user namespace's only.
		// runc reads the mapping from the namespace itself.
		nss = append(nss, specs.LinuxNamespace{Type: specs.UserNamespace, Path: s.UsernsPath})
	}
	return nss
}

// blockIO is the sandbox's disk throttle on the device given as
// "major:minor"; nil without one.
func blockIO(l Limits) *specs.LinuxBlockIO {
	if l.IODevice == "" || (l.IOReadBPS <= 0 && l.IOWriteBPS <= 0) {
		return nil
	}
	var maj, min int64
	if _, err := fmt.Sscanf(l.IODevice, "%d:%d", &maj, &min); err != nil {
		return nil
	}
	dev := specs.LinuxBlockIODevice{Major: maj, Minor: min}
	bio := &specs.LinuxBlockIO{}
	if l.IOReadBPS > 0 {
		bio.ThrottleReadBpsDevice = []specs.LinuxThrottleDevice{{LinuxBlockIODevice: dev, Rate: l.IOReadBPS}}
	}
	if l.IOWriteBPS > 0 {
		bio.ThrottleWriteBpsDevice = []specs.LinuxThrottleDevice{{LinuxBlockIODevice: dev, Rate: l.IOWriteBPS}}
	}
	return bio
}

func resources(l Limits) (*specs.LinuxMemory, *specs.LinuxCPU, *specs.LinuxPids) {
	var mem *specs.LinuxMemory
	if l.MemoryBytes > 0 {
		limit := l.MemoryBytes
		mem = &specs.LinuxMemory{Limit: &limit}
		if swapAccounting() {
			// OCI swap is memory+swap (v1 semantics): equal to the limit means no swap.
			swap := l.MemoryBytes
			mem.Swap = &swap
		}
		zero := uint64(0)
		mem.Swappiness = &zero
		if cgroups.IsCgroup2UnifiedMode() {
			mem.Swappiness = nil // not a v2 knob
		}
	}
	var cpu *specs.LinuxCPU
	if l.CPUs > 0 {
		period := uint64(100000)
		quota := int64(l.CPUs * float64(period))
		cpu = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	var pids *specs.LinuxPids
	if l.Pids > 0 {
		pids = &specs.LinuxPids{Limit: &l.Pids}
	}
	return mem, cpu, pids
}

// swapAccounting reports whether the kernel accounts swap per cgroup; setting a
// memory+swap limit fails otherwise (and then there is no swap to limit).
func swapAccounting() bool {
	if cgroups.IsCgroup2UnifiedMode() {
		_, err := os.Stat("/sys/fs/cgroup/memory.swap.max")
		if err == nil {
			return true
		}
		// The root cgroup has no memory.swap.max; look at any child instead.
		matches, _ := filepath.Glob("/sys/fs/cgroup/*/memory.swap.max")
		return len(matches) > 0
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// Start creates the container and runs its init. On error nothing is left
// behind: no libcontainer state, no cgroup.
func (r *Runtime) Start(s *Spec) (_ *Instance, retErr error) {
	if len(s.InitArgs) == 0 {
		return nil, errors.New("runtime: empty init argv")
	}
	spec, cfg, err := r.containerConfig(s)
	if err != nil {
		return nil, err
	}

	logf, err := os.OpenFile(s.InitLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open init log: %w", err)
	}
	// The child holds its own copy of the descriptor; ours is not needed after Run.
	defer logf.Close()

	reg := rtrace.StartRegion(context.Background(), "runtime.create")
	ct, err := libcontainer.Create(r.Root, s.ID, cfg)
	reg.End()
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = ct.Signal(unix.SIGKILL)
			if derr := ct.Destroy(); derr != nil {
				r.log.Warn("destroy after failed start", "sandbox", s.ID, "err", derr)
			}
		}
	}()
	proc := initProcess(s, spec, logf)
	r.withInitExe(proc)
	reg = rtrace.StartRegion(context.Background(), "runtime.run")
	err = ct.Run(proc)
	reg.End()
	if err != nil {
		return nil, fmt.Errorf("start sandbox init: %w", err)
	}
	// Init runs: a failure from here on kills and reaps it (the deferred
	// Destroy removes the rest).
	st, err := ct.State()
	if err != nil {
		_ = ct.Signal(unix.SIGKILL)
		_, _ = proc.Wait()
		return nil, fmt.Errorf("read container state: %w", err)
	}
	cg, err := manager.NewWithPaths(cfg.Cgroups, st.CgroupPaths)
	if err != nil {
		_ = ct.Signal(unix.SIGKILL)
		_, _ = proc.Wait()
		return nil, fmt.Errorf("sandbox cgroups: %w", err)
	}
	inst := &Instance{
		ID: s.ID, Pid: st.InitProcessPid, StartTime: st.InitProcessStartTime, Cgroups: st.CgroupPaths,
		cg: cg, done: make(chan struct{}),
	}
	inst.awaitExit()
	r.mu.Lock()
	r.instances[s.ID] = inst
	r.mu.Unlock()
	return inst, nil
}

// containerConfig is the libcontainer configuration of s, and its spec.
func (r *Runtime) containerConfig(s *Spec) (*specs.Spec, *configs.Config, error) {
	spec := BuildSpec(s)
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   s.ID,
		Spec:         spec,
		NoNewKeyring: true, // keyctl is denied anyway; do not leak the session keyring
	})
	if err != nil {
		return nil, nil, fmt.Errorf("build container config: %w", err)
	}
	cfg.Labels = append(cfg.Labels, "owner=mcp-sandboxd")
	if cfg.Seccomp != nil {
		cfg.Seccomp.Syscalls = r.rules.intern(cfg.Seccomp.Syscalls)
	}
	return spec, cfg, nil
}

// withInitExe passes the sealed sandbox-init to proc's `runc init`, if the
// runtime has one (initexec.go).
func (r *Runtime) withInitExe(proc *libcontainer.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.initExe != nil {
		// Last, after the agent's descriptors: the child's constructor
		// makes it close-on-exec before it executes it, so that it
		// reaches neither sandbox-init nor the agent.
		proc.ExtraFiles = append(slices.Clip(proc.ExtraFiles), r.initExe)
	}
}

// initProcess is the sandbox's init, our agent, as libcontainer runs it:
// root of the sandbox, with the spec's capabilities, its output in logf.
func initProcess(s *Spec, spec *specs.Spec, logf *os.File) *libcontainer.Process {
	nnp := true
	proc := &libcontainer.Process{
		Args:            s.InitArgs,
		Env:             s.InitEnv,
		Cwd:             "/",
		UID:             0,
		GID:             0,
		Stdout:          logf,
		Stderr:          logf,
		Init:            true,
		ExtraFiles:      s.InitFiles,
		NoNewPrivileges: &nnp,
		Capabilities: &configs.Capabilities{
			Bounding: spec.Process.Capabilities.Bounding, Effective: spec.Process.Capabilities.Effective,
			Permitted: spec.Process.Capabilities.Permitted,
		},
		Rlimits: []configs.Rlimit{
			{Type: unix.RLIMIT_NOFILE, Hard: NofileLimit, Soft: NofileLimit},
			{Type: unix.RLIMIT_CORE, Hard: 0, Soft: 0},
		},
	}
	if s.UsernsPath != "" {
		// runc sets them with prlimit(2) from the host once init runs as
		// the namespace's uid, which needs CAP_SYS_RESOURCE on the host
		// (hosts and container-in-VM setups that withhold it exist): init
		// lowers its own limits instead (the agent's --nofile).
		proc.Rlimits = nil
	}
	return proc
}

// awaitExit arranges for init's exit to be recorded and done closed.
// Init's exit is awaited through a pidfd in the shared watcher
// (pkg/fdwatch), and
// only then reaped: a goroutine blocked in wait(2) would hold an OS thread
// for each live sandbox, and one parked on the pidfd its stack. Init is
// our child and unreaped until Wait, so its pid cannot be recycled
// meanwhile.
func (i *Instance) awaitExit() {
	pidfd, err := unix.PidfdOpen(i.Pid, unix.PIDFD_NONBLOCK)
	if err == nil {
		exited := func(int) bool {
			go i.reap()
			return true
		}
		if w := fdwatch.Shared(); w != nil && w.Add(pidfd, exited) == nil {
			return
		}
	}
	go func() {
		if err == nil {
			waitExited(pidfd)
		}
		i.reap()
	}()
}

// reap collects init once it has exited (or blocks until it does) and
// finishes the instance. We are init's parent (libcontainer uses
// CLONE_PARENT), so we must reap it.
func (i *Instance) reap() {
	// Wait for the exit without reaping (WNOWAIT) and without reapMu:
	// when no pidfd could be had, this is where the wait blocks, and kill
	// must still be able to signal init meanwhile.
	var si unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, i.Pid, &si, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	var ws unix.WaitStatus
	i.reapMu.Lock()
	var err error
	for {
		_, err = unix.Wait4(i.Pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	i.reaped = true
	i.reapMu.Unlock()
	i.finish(exitString(ws, err))
}

// exitString says how a process ended, as os.ProcessState.String does
// ("exit status 1", "signal: killed").
func exitString(ws unix.WaitStatus, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return ""
}

// Adopt re-attaches to a sandbox started by an earlier daemon process. It
// fails with an error wrapping libcontainer.ErrNotExist when there is no state,
// and returns ErrNotRunning (with the container still loaded for Destroy) when
// init is gone.
func (r *Runtime) Adopt(id string) (*Instance, error) {
	ct, err := libcontainer.Load(r.Root, id)
	if err != nil {
		return nil, err
	}
	st, err := ct.State()
	if err != nil {
		return nil, fmt.Errorf("read container state: %w", err)
	}
	inst := &Instance{ID: id, Pid: st.InitProcessPid, StartTime: st.InitProcessStartTime, Cgroups: st.CgroupPaths, ct: ct, done: make(chan struct{})}
	r.mu.Lock()
	r.instances[id] = inst
	r.mu.Unlock()
	status, err := ct.Status()
	if err != nil || status == libcontainer.Stopped {
		inst.finish("")
		return inst, ErrNotRunning
	}
	// Not our child any more: watch init through a pidfd. Load has already
	// checked init's start time, so the pid is not a recycled one.
	pidfd, err := unix.PidfdOpen(inst.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		inst.finish("")
		return inst, ErrNotRunning
	}
	exited := func(int) bool {
		go inst.finish("")
		return true
	}
	if w := fdwatch.Shared(); w == nil || w.Add(pidfd, exited) != nil {
		go func() {
			waitExited(pidfd)
			inst.finish("")
		}()
	}
	return inst, nil
}

// waitExited returns once the process of pidfd (non-blocking) has exited,
// and closes pidfd. It waits in Go's poller (a pidfd is readable once its
// process has exited), so that no OS thread is held per sandbox; should the
// poller refuse the descriptor, it falls back to a blocking poll(2).
func waitExited(pidfd int) {
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	exited := func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err != nil || n > 0
		}
	}
	if rc, err := f.SyscallConn(); err == nil {
		if rc.Read(exited) == nil {
			return
		}
	}
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// ErrNotRunning is returned by Adopt when the sandbox's init has exited.
var ErrNotRunning = errors.New("sandbox init is not running")

// Pause freezes every process of the sandbox (libcontainer's cgroup
// manager: freezer.state on cgroup v1, cgroup.freeze on v2), waiting until
// the kernel reports them frozen. Pausing a paused sandbox is a no-op.
func (i *Instance) Pause() error {
	if i.ct == nil {
		if err := i.cg.Freeze(cgroups.Frozen); err != nil {
			return fmt.Errorf("freeze sandbox %s: %w", i.ID, err)
		}
		return nil
	}
	if st, err := i.ct.Status(); err == nil && st == libcontainer.Paused {
		return nil
	}
	if err := i.ct.Pause(); err != nil {
		return fmt.Errorf("freeze sandbox %s: %w", i.ID, err)
	}
	return nil
}

// Resume thaws a paused sandbox; resuming a running one is a no-op.
func (i *Instance) Resume() error {
	if i.ct == nil {
		if err := i.cg.Freeze(cgroups.Thawed); err != nil {
			return fmt.Errorf("thaw sandbox %s: %w", i.ID, err)
		}
		return nil
	}
	if err := i.ct.Resume(); err != nil && !errors.Is(err, libcontainer.ErrNotPaused) {
		return fmt.Errorf("thaw sandbox %s: %w", i.ID, err)
	}
	return nil
}

// Paused reports whether the sandbox is frozen.
func (i *Instance) Paused() (bool, error) {
	if i.ct == nil {
		st, err := i.cg.GetFreezerState()
		return st == cgroups.Frozen, err
	}
	st, err := i.ct.Status()
	if err != nil {
		return false, err
	}
	return st == libcontainer.Paused, nil
}

// Instance returns the running instance with id, if this Runtime knows it.
func (r *Runtime) Instance(id string) (*Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.instances[id]
	return i, ok
}

// Destroy kills the sandbox's every process and removes its cgroups and
// libcontainer state. It is idempotent: a sandbox without state is gone already.
func (r *Runtime) Destroy(id string) error {
	destroy, err := r.kill(id)
	if err != nil || destroy == nil {
		return err
	}
	reg := rtrace.StartRegion(context.Background(), "runtime.destroy")
	err = destroy()
	reg.End()
	if err != nil {
		return fmt.Errorf("destroy container %s: %w", id, err)
	}
	r.mu.Lock()
	delete(r.instances, id)
	r.mu.Unlock()
	return nil
}

// Kill kills the sandbox's every process and waits until they are gone,
// leaving its cgroups and state for Destroy: what must be over before the
// sandbox's file systems can be unmounted, while its cgroups can go at the
// same time as they are. A sandbox without state is gone already.
func (r *Runtime) Kill(id string) error {
	_, err := r.kill(id)
	return err
}

// kill is Kill, returning what removes the sandbox's cgroups and state
// for Destroy (nil when there was no state to load: nothing left to
// destroy).
func (r *Runtime) kill(id string) (func() error, error) {
	r.mu.Lock()
	inst := r.instances[id]
	r.mu.Unlock()
	if inst != nil && inst.ct == nil {
		return inst.kill(filepath.Join(r.Root, id))
	}
	var ct *libcontainer.Container
	if inst != nil {
		ct = inst.ct
	} else {
		var err error
		ct, err = libcontainer.Load(r.Root, id)
		if errors.Is(err, libcontainer.ErrNotExist) {
			// A start that died before state.json was written leaves only the
			// directory behind (runc delete does the same).
			return nil, os.RemoveAll(filepath.Join(r.Root, id))
		}
		if err != nil {
			return nil, fmt.Errorf("load container %s: %w", id, err)
		}
	}
	// A frozen task (cgroup v1 freezer) does not die of SIGKILL until it is
	// thawed, and libcontainer refuses to destroy a paused container.
	if st, err := ct.Status(); err == nil && st == libcontainer.Paused {
		if err := ct.Resume(); err != nil {
			return nil, fmt.Errorf("thaw sandbox %s before killing it: %w", id, err)
		}
	}
	// With a private PID namespace, killing init makes the kernel kill the rest.
	reg := rtrace.StartRegion(context.Background(), "runtime.kill")
	if err := ct.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		r.log.Debug("kill sandbox init", "sandbox", id, "err", err)
	}
	stopped := waitStopped(ct, 10*time.Second)
	reg.End()
	if !stopped {
		return nil, fmt.Errorf("sandbox %s: init still running 10s after SIGKILL", id)
	}
	return ct.Destroy, nil
}

// kill kills a sandbox started here (what libcontainer's Signal and
// Destroy do for a container with a private PID namespace, without its
// objects) and returns what removes its cgroups and its state directory.
func (i *Instance) kill(stateDir string) (func() error, error) {
	// A frozen task (cgroup v1 freezer) does not die of SIGKILL until it is
	// thawed.
	if st, err := i.cg.GetFreezerState(); err == nil && st == cgroups.Frozen {
		if err := i.cg.Freeze(cgroups.Thawed); err != nil {
			return nil, fmt.Errorf("thaw sandbox %s before killing it: %w", i.ID, err)
		}
	}
	// With a private PID namespace, killing init makes the kernel kill the
	// rest. Init is our child: until reaped, its pid is its own.
	reg := rtrace.StartRegion(context.Background(), "runtime.kill")
	i.reapMu.Lock()
	if !i.reaped {
		if err := unix.Kill(i.Pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			i.reapMu.Unlock()
			reg.End()
			return nil, fmt.Errorf("kill sandbox %s init: %w", i.ID, err)
		}
	}
	i.reapMu.Unlock()
	// The reaping (awaitExit) closes done once init is gone.
	var stopped bool
	select {
	case <-i.done:
		stopped = true
	case <-time.After(10 * time.Second):
	}
	reg.End()
	if !stopped {
		return nil, fmt.Errorf("sandbox %s: init still running 10s after SIGKILL", i.ID)
	}
	return func() error {
		if err := i.cg.Destroy(); err != nil {
			return fmt.Errorf("unable to remove container's cgroup: %w", err)
		}
		if err := os.RemoveAll(stateDir); err != nil {
			return fmt.Errorf("unable to remove container state dir: %w", err)
		}
		return nil
	}, nil
}

func waitStopped(ct *libcontainer.Container, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if st, err := ct.Status(); err != nil || st == libcontainer.Stopped {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// List returns the ids of every container in the state root, including
// half-created ones without state.json.
func (r *Runtime) List() ([]string, error) {
	ents, err := os.ReadDir(r.Root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
