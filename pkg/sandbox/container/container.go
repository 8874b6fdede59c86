// Package container is the sandbox backend that runs each sandbox as a
// libcontainer container (pkg/runtime): an overlay root over the image, a
// cgroup with the sandbox's limits, and sandbox-agent as PID 1 on a unix
// socket in a root-only directory of the host.
//
// What one sandbox holds, in acquisition order (each recorded in the ledger
// before it is acquired, released in reverse):
//
//	userns     the sandbox's range of host ids (a row of pkg/store), when
//	           sandboxes run in their own user namespace
//	dir        RunDir/sandboxes/<id>: the agent's socket dir, its log
//	image      SandboxesDir/<id>.img: the sparse ext4 image (disk backing)
//	loop       the loop device backed by that image (disk backing)
//	mount      RunDir/sandboxes/<id>/disk: the image's ext4, or a tmpfs
//	           (memory backing), holding every byte the sandbox can write
//	layers     RunDir/sandboxes/<id>/layers: the overlay of the image and
//	           the upper layer on the mount
//	cgroup     CgroupParent/<id>
//	container  libcontainer state and the sandbox's processes
//
// The security boundaries of a container sandbox are enforced in
// pkg/runtime (namespaces, read-only root, seccomp, capabilities, cgroups)
// and pkg/agent/server (commands without capabilities, file operations
// confined to the root); they are written down there.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/userns"
)

// Resource kinds of a container sandbox.
const (
	KindUserns    = "userns"
	KindDir       = "dir"
	KindImage     = "image"
	KindLoop      = "loop"
	KindMount     = "mount"
	KindLayers    = "layers"
	KindCgroup    = "cgroup"
	KindContainer = "container"
)

// Paths inside every sandbox where the backend mounts the agent.
const (
	agentBinaryInside = "/.sandboxd/agent"
	agentRunInside    = "/.sandboxd/run"
	cgroupsInside     = "/.sandboxd/cgroup"
	agentSocketName   = "agent.sock"
)

// Crash points (internal/crashpoint) after each acquisition of Start.
const (
	CrashAfterDir       = "container.dir"
	CrashAfterImage     = "container.image"
	CrashAfterLoop      = "container.loop"
	CrashAfterMount     = "container.mount"
	CrashAfterLayers    = "container.layers"
	CrashAfterContainer = "container.started"
)

// Options configure the backend.
type Options struct {
	Runtime *runtime.Runtime
	Seccomp *specs.LinuxSeccomp // nil only when seccomp is explicitly off
	// SeccompProfiles are the profiles a sandbox may choose by name
	// (sandbox.Spec.SeccompProfile); Seccomp applies when it names none.
	SeccompProfiles map[string]*specs.LinuxSeccomp
	// RootSeccomp and RootSeccompProfiles are the same profiles resolved
	// for root mode's capability set (runtime.RootModeCapabilities): a
	// profile allows some syscalls only to holders of a capability.
	RootSeccomp         *specs.LinuxSeccomp
	RootSeccompProfiles map[string]*specs.LinuxSeccomp
	// SeccompDiagnostics counts each job's refused syscalls (see
	// pkg/seccomp/diagnose.go) through a notification listener per sandbox.
	SeccompDiagnostics bool
	// Landlock has every sandbox's agent confine itself and its commands
	// to the paths its spec declares (pkg/landlock); the engine sets it
	// when the kernel can (landlock.Detect).
	Landlock     bool
	AgentPath    string         // host path of the static sandbox-agent binary
	RunDir       string         // per-sandbox mounts and sockets live in RunDir/sandboxes
	Storage      *storage.Store // image files of disk-backed sandboxes
	Pool         *storage.Pool  // ready disks of the default geometry; nil: none
	CgroupParent string
	IO           IOLimits // block I/O throttles of every sandbox
	// Userns gives every sandbox its own user namespace and range of host
	// ids; nil runs sandboxes in the host's (as host root and uid UID).
	Userns *UsernsPool
	Log    *slog.Logger
}

// UsernsPool is the host id space of sandbox user namespaces: Count ranges
// of Size ids from Base, range n held by at most one sandbox at a time as
// Ranges records (pkg/store).
type UsernsPool struct {
	Base, Size uint32
	Count      int
	Ranges     IDRanges
}

// IDRanges hands out range numbers (pkg/store implements it in SQLite, so
// a restart never hands out a held range again).
type IDRanges interface {
	AcquireIDRange(ctx context.Context, sandboxID string, count int) (int, error)
	ReleaseIDRange(ctx context.Context, sandboxID string) error
	IDRanges(ctx context.Context) (map[string]int, error)
}

func (p *UsernsPool) idMap(slot int) *userns.IDMap {
	return &userns.IDMap{HostID: p.Base + uint32(slot)*p.Size, Size: p.Size}
}

// IOLimits throttle a sandbox's block I/O on one device; zero rates are none.
type IOLimits struct {
	Device   string // "major:minor"
	ReadBPS  uint64
	WriteBPS uint64
}

// Backend runs sandboxes as containers.
type Backend struct {
	opt Options
	log *slog.Logger

	// destroying maps a sandbox id to a channel closed once the finishing
	// part of its container's release (libcontainer's Destroy) is over:
	// its cgroup's release waits for it.
	destroying sync.Map
}

var (
	_ sandbox.Backend       = (*Backend)(nil)
	_ sandbox.Pauser        = (*handle)(nil)
	_ sandbox.WritableState = (*handle)(nil)
)

// New checks the options, prepares the run dir and the cgroup parent, and
// registers the backend's resource kinds with l.
func New(opt Options, l *ledger.Ledger) (*Backend, error) {
	if opt.Runtime == nil {
		return nil, errors.New("container backend: runtime is required")
	}
	if opt.Storage == nil {
		return nil, errors.New("container backend: storage is required")
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if _, err := os.Stat(opt.AgentPath); err != nil {
		return nil, fmt.Errorf("sandbox agent binary: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(opt.RunDir, "sandboxes"), 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox run dir: %w", err)
	}
	if opt.Userns != nil {
		if err := userns.Supported(); err != nil {
			return nil, fmt.Errorf("sandbox.userns_pool: %w (set sandbox.userns_pool.count to 0 to run sandboxes without user namespaces)", err)
		}
		// A sandbox's init runs as an unprivileged host uid and must walk
		// (not list) down to its root and binds; each sandbox's own dir
		// lets only that sandbox's group through (see Start).
		for _, d := range []string{opt.RunDir, filepath.Join(opt.RunDir, "sandboxes")} {
			if err := addSearch(d); err != nil {
				return nil, err
			}
		}
		l.Register(KindUserns, func(ctx context.Context, r ledger.Resource) error {
			return opt.Userns.Ranges.ReleaseIDRange(ctx, r.Key)
		})
	}
	if err := cgroups.EnsureParent(opt.CgroupParent); err != nil {
		return nil, err
	}
	b := &Backend{opt: opt, log: opt.Log}
	// A container is released in two parts: its processes are killed and
	// gone before the walk goes on to its file systems; libcontainer's
	// Destroy (its cgroups, ten v1 hierarchies, and its state: ~0.9 ms)
	// runs meanwhile, beside the overlay's and the disk's unmounts. Its
	// row goes once both are over.
	l.RegisterStaged(KindContainer, func(_ context.Context, r ledger.Resource) (func() error, error) {
		if err := opt.Runtime.Kill(r.Key); err != nil {
			return nil, err
		}
		done := make(chan struct{})
		b.destroying.Store(r.Key, done)
		return func() error {
			defer func() {
				b.destroying.Delete(r.Key)
				close(done)
			}()
			return opt.Runtime.Destroy(r.Key)
		}, nil
	})
	// The sandbox's cgroup holds the container's: removed once Destroy
	// removed those, after the walk's part of the release.
	l.RegisterStaged(KindCgroup, func(_ context.Context, r ledger.Resource) (func() error, error) {
		return func() error {
			if d, ok := b.destroying.Load(filepath.Base(r.Key)); ok {
				<-d.(chan struct{})
			}
			if !cgroups.Exists(r.Key) {
				return nil
			}
			return cgroups.Remove(r.Key)
		}, nil
	})
	l.Register(KindLayers, func(_ context.Context, r ledger.Resource) error { return image.ReleaseDir(r.Key) })
	l.Register(KindMount, func(_ context.Context, r ledger.Resource) error { return image.ReleaseDir(r.Key) })
	l.Register(KindLoop, func(_ context.Context, r ledger.Resource) error { return storage.Detach(r.Key) })
	l.Register(KindImage, func(_ context.Context, r ledger.Resource) error { return opt.Storage.Discard(r.Key) })
	// The dir is released last, but unmount anything still below it rather
	// than reach into a mounted file system with RemoveAll.
	l.Register(KindDir, func(_ context.Context, r ledger.Resource) error { return image.ReleaseDir(r.Key) })
	return b, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "container" }

// capabilities of a container: our agent inside, a writable state on the
// host that workspace snapshots archive, and the cgroup freezer. No screen
// and no machine to snapshot.
var capabilities = sandbox.Capabilities{Agent: true, FileSnapshot: true, Pause: true}

// Capabilities implements sandbox.Backend.
func (b *Backend) Capabilities() sandbox.Capabilities { return capabilities }

func (b *Backend) dir(id string) string { return filepath.Join(b.opt.RunDir, "sandboxes", id) }

func (b *Backend) cgroupPath(id string) string { return filepath.Join(b.opt.CgroupParent, id) }

// sandboxIdentity is what Start made of a sandbox's identity on the host:
// its state directory and, with user namespaces, its id map and pinned
// namespace.
type sandboxIdentity struct {
	dir, agentDir string
	idmap         *userns.IDMap // nil without user namespaces
	ns            *os.File      // the pinned user namespace; nil without
	usernsPath    string
}

// host maps an id inside the sandbox to the host's.
func (si *sandboxIdentity) host(id int) int {
	if si.idmap == nil {
		return id
	}
	return si.idmap.Host(id)
}

// close releases the descriptor of the namespace: its pin in dir keeps it.
func (si *sandboxIdentity) close() {
	if si.ns != nil {
		si.ns.Close()
	}
}

// Start implements sandbox.Backend: identity (id range, state dir, user
// namespace), file system (disk, layers, seed), then the container, in
// that order; each step's resources are in the ledger before they exist.
func (b *Backend) Start(ctx context.Context, req sandbox.StartRequest, rec ledger.Recorder) (sandbox.Handle, error) {
	si, err := b.startIdentity(ctx, req.ID, rec)
	if err != nil {
		return nil, err
	}
	defer si.close()
	crashpoint.Hit(CrashAfterDir)
	layers, err := b.startFilesystem(ctx, req, si, rec)
	if err != nil {
		return nil, err
	}
	return b.startContainer(ctx, req, si, layers, rec)
}

// startIdentity acquires the sandbox's user namespace id range (when user
// namespaces are on) and makes its state directory, owned so that only
// the sandbox and root on the host reach into it.
func (b *Backend) startIdentity(ctx context.Context, id string, rec ledger.Recorder) (*sandboxIdentity, error) {
	si := &sandboxIdentity{dir: b.dir(id)}
	if p := b.opt.Userns; p != nil {
		// Recorded first, released last: the range is free again only once
		// every process and file of the sandbox is gone.
		if err := rec.Record(ctx, ledger.Resource{Kind: KindUserns, Key: id}); err != nil {
			return nil, err
		}
		reg := rtrace.StartRegion(ctx, "container.idrange")
		slot, err := p.Ranges.AcquireIDRange(ctx, id, p.Count)
		reg.End()
		if err != nil {
			if errors.Is(err, store.ErrNoIDRange) {
				return nil, errdefs.New(errdefs.LimitExceeded, "every one of the %d user namespace id ranges (sandbox.userns_pool.count) is in use", p.Count)
			}
			return nil, err
		}
		si.idmap = p.idMap(slot)
	}
	if err := rec.Record(ctx, ledger.Resource{Kind: KindDir, Key: si.dir}); err != nil {
		return nil, err
	}
	si.agentDir = filepath.Join(si.dir, "agent")
	if err := os.MkdirAll(si.agentDir, 0o700); err != nil {
		return nil, fmt.Errorf("create agent dir: %w", err)
	}
	if si.idmap == nil {
		return si, nil
	}
	// The sandbox's init walks through dir to its root and binds: its
	// group (the range's first gid) may, no other host user may (the
	// paths are in /proc/mounts for everyone to see).
	if err := os.Chown(si.dir, 0, si.host(0)); err != nil {
		return nil, fmt.Errorf("create sandbox dir: %w", err)
	}
	if err := os.Chmod(si.dir, 0o710); err != nil {
		return nil, fmt.Errorf("create sandbox dir: %w", err)
	}
	// The agent (the sandbox's root) creates its socket here; only
	// root on the host and that sandbox can reach it.
	if err := os.Chown(si.agentDir, si.host(0), si.host(0)); err != nil {
		return nil, fmt.Errorf("create agent dir: %w", err)
	}
	// The namespace is pinned in dir (released with it) until the sandbox
	// runs (unpinUserns), where the runtime joins it; the layers idmap the
	// image with it.
	reg := rtrace.StartRegion(ctx, "container.userns")
	ns, err := userns.NamespaceFD(*si.idmap)
	reg.End()
	if err != nil {
		return nil, err
	}
	si.ns = ns
	si.usernsPath = filepath.Join(si.dir, "userns")
	if err := userns.Pin(ns, si.usernsPath); err != nil {
		si.close()
		return nil, err
	}
	return si, nil
}

// startFilesystem mounts the sandbox's disk and prepares its layers, then
// writes what the daemon puts into every root: its identity, a fork's
// snapshot and the resolver configuration.
func (b *Backend) startFilesystem(ctx context.Context, req sandbox.StartRequest, si *sandboxIdentity, rec ledger.Recorder) (*image.Layers, error) {
	spec := req.Spec
	disk := filepath.Join(si.dir, "disk")
	reg := rtrace.StartRegion(ctx, "container.disk")
	err := b.mountDisk(ctx, req.ID, disk, spec, rec)
	reg.End()
	if err != nil {
		return nil, err
	}
	crashpoint.Hit(CrashAfterMount)

	layersDir := filepath.Join(si.dir, "layers")
	if err := rec.Record(ctx, ledger.Resource{Kind: KindLayers, Key: layersDir}); err != nil {
		return nil, err
	}
	reg = rtrace.StartRegion(ctx, "container.layers")
	layers, err := image.PrepareMappedLayers(req.Image, layersDir, disk, spec.UID, spec.UID, si.idmap, si.ns)
	reg.End()
	if err != nil {
		return nil, fmt.Errorf("prepare filesystem: %w", err)
	}
	crashpoint.Hit(CrashAfterLayers)
	if err := writeIdentity(layers.Rootfs, req.ID, si.host(0)); err != nil {
		return nil, err
	}
	if spec.Seed != "" {
		// A fork: the snapshot's files, before any sandbox process runs.
		if err := storage.ApplySnapshot(spec.Seed, storage.ApplyTargets{
			Rootfs: layers.Rootfs, SkipRoot: daemonFiles, Workspace: layers.Workspace, Tmp: layers.Tmp, UID: spec.UID,
			IDs: snapshotIDs(si.idmap),
		}); err != nil {
			return nil, fmt.Errorf("restore snapshot %s: %w", spec.SeedSnapshot, err)
		}
	}
	if req.ResolvConf != nil {
		if err := writeResolvConf(layers.Rootfs, req.ResolvConf, si.host(0)); err != nil {
			return nil, err
		}
	}
	return layers, nil
}

// writeResolvConf replaces the image's /etc/resolv.conf, which may be a
// symlink (systemd-resolved style): replaced rather than written through.
func writeResolvConf(rootfs string, content []byte, owner int) error {
	p := filepath.Join(rootfs, "etc/resolv.conf")
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write /etc/resolv.conf: %w", err)
	}
	if err := os.WriteFile(p, content, 0o644); err != nil {
		return fmt.Errorf("write /etc/resolv.conf: %w", err)
	}
	if err := os.Lchown(p, owner, owner); err != nil {
		return fmt.Errorf("write /etc/resolv.conf: %w", err)
	}
	return nil
}

// seccompProfile chooses the sandbox's seccomp profile (root mode has its
// own) and, with diagnostics on, starts the monitor its notify rules
// report to. The monitor is nil without diagnostics.
func (b *Backend) seccompProfile(ctx context.Context, id, dir string, spec sandbox.Spec, rootMode bool) (*seccompProfileChoice, error) {
	prof, profiles := b.opt.Seccomp, b.opt.SeccompProfiles
	if rootMode {
		prof, profiles = b.opt.RootSeccomp, b.opt.RootSeccompProfiles
	}
	if spec.SeccompProfile != "" {
		p, ok := profiles[spec.SeccompProfile]
		if !ok {
			return nil, fmt.Errorf("unknown seccomp profile %q", spec.SeccompProfile)
		}
		prof = p
	}
	choice := &seccompProfileChoice{profile: prof}
	if b.opt.SeccompDiagnostics && prof != nil {
		sock := filepath.Join(dir, "seccomp.sock")
		_ = os.Remove(sock) // a leftover of an earlier attempt
		reg := rtrace.StartRegion(ctx, "container.seccomp-listen")
		monitor, err := seccomp.Listen(sock, jobOfPid, b.log.With("sandbox", id))
		reg.End()
		if err != nil {
			return nil, err
		}
		choice.monitor = monitor
		choice.profile = seccomp.WithNotify(prof, sock)
	}
	return choice, nil
}

// seccompProfileChoice is the profile a sandbox runs under and the
// monitor of its notify rules (nil without diagnostics).
type seccompProfileChoice struct {
	profile *specs.LinuxSeccomp
	monitor *seccomp.Monitor
}

// close stops the monitor of a sandbox that did not start.
func (c *seccompProfileChoice) close() {
	if c.monitor != nil {
		c.monitor.Close()
	}
}

// jobCgroupBinds creates the sandbox's delegated cgroup directories and
// binds them into the sandbox. The agent gives every job its own child
// cgroup of the sandbox's (see pkg/agent/server/jobcgroup.go): the
// directories are delegated to it, writable by root only, below its
// cgroup namespace. Created here (libcontainer joins existing ones) so
// they can be bound.
func jobCgroupBinds(ctx context.Context, cg string, si *sandboxIdentity) ([]runtime.Bind, error) {
	defer rtrace.StartRegion(ctx, "container.cgroup-dirs").End()
	var binds []runtime.Bind
	for name, dir := range cgroups.DelegatedDirs(cg) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		if si.idmap != nil {
			// The agent is root of the sandbox's namespace only: the
			// directory is delegated to that root's host uid.
			if err := cgroups.Delegate(dir, si.host(0), si.host(0)); err != nil {
				return nil, err
			}
		}
		binds = append(binds, runtime.Bind{Source: dir, Destination: filepath.Join(cgroupsInside, name), NoExec: true})
	}
	return binds, nil
}

// agentInitEnv is the environment of the sandbox's PID 1, our agent (its
// commands get their own, pkg/agent/server). GODEBUG=memprofilerate=0
// turns the Go runtime's memory profiler off before its first allocation,
// which the agent's main comes too late for: that allocation is sampled
// (a fresh allocation cache samples its first), and the sample touches
// the profiler's bucket table and a chunk of its own — up to 0.3 MiB of
// every idle sandbox (docs/ARCHITECTURE.md, "Where an idle sandbox's
// memory goes").
var agentInitEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GODEBUG=memprofilerate=0"}

// sandboxPids is the pids.max of a sandbox's cgroup whose commands may have
// limit tasks: the agent's own reserve above it (see agent.PidsReserve).
func sandboxPids(limit int64) int64 {
	if limit <= 0 {
		return limit
	}
	return limit + agent.PidsReserve
}

// agentInitArgs is the command line of the sandbox's PID 1, our agent.
func agentInitArgs(spec sandbox.Spec, userns, rootMode bool) []string {
	uid := strconv.Itoa(spec.UID)
	// Finished jobs are kept (for job_status and re-attach after a daemon
	// restart) with up to 1 MiB of output tail each, charged to the
	// sandbox's memory: bound how many.
	args := []string{agentBinaryInside, "--socket", agentRunInside + "/" + agentSocketName, "--listen-fd", "3", "--uid", uid, "--gid", uid,
		"--retain-bytes", "1048576", "--max-finished", "32", "--cgroups", cgroupsInside}
	if spec.Limits.Pids > 0 {
		args = append(args, "--jobs-pids", strconv.FormatInt(spec.Limits.Pids, 10))
	}
	if userns {
		args = append(args, "--nofile", strconv.Itoa(runtime.NofileLimit)) // see runtime.Start
	}
	if rootMode && spec.UID != 0 {
		// Root mode with an unprivileged default user (the E2B front
		// end's sandboxes): uid 0 on request is root of the sandbox's
		// user namespace, capabilities included.
		args = append(args, "--root-mode")
	}
	return args
}

// agentLandlockArgs asks the agent to confine itself and every command to
// paths with Landlock (pkg/landlock) before it serves, and to exit if it
// cannot: the daemon asks only when the host's kernel can.
func agentLandlockArgs(paths []landlock.Path) []string {
	args := make([]string, 0, 1+2*len(paths))
	args = append(args, "--landlock")
	for _, p := range paths {
		args = append(args, "--landlock-path", p.String())
	}
	return args
}

// sandboxBinds is what the sandbox sees of the host: its workspace and
// tmp, our agent and its socket directory, its named volumes and its
// delegated cgroups; and, in its own network namespace, the sysfs of
// that namespace (mounted under dir; "" when none is needed).
func (b *Backend) sandboxBinds(ctx context.Context, req sandbox.StartRequest, si *sandboxIdentity, layers *image.Layers, cg string) ([]runtime.Bind, string, error) {
	binds := []runtime.Bind{
		{Source: layers.Workspace, Destination: "/workspace"},
		{Source: layers.Tmp, Destination: "/tmp"},
		{Source: b.opt.AgentPath, Destination: agentBinaryInside, ReadOnly: true},
		{Source: si.agentDir, Destination: agentRunInside, NoExec: true},
	}
	vbinds, err := mountVolumes(si.dir, req.Spec.Volumes, si.ns)
	if err != nil {
		return nil, "", err
	}
	cbinds, err := jobCgroupBinds(ctx, cg, si)
	if err != nil {
		return nil, "", err
	}
	binds = append(append(binds, vbinds...), cbinds...)
	sysfs := ""
	if si.idmap != nil && req.NetNSPath != "" {
		sysfs = filepath.Join(si.dir, "sys")
		if err := mountNetSysfs(req.NetNSPath, sysfs); err != nil {
			return nil, "", err
		}
	}
	return binds, sysfs, nil
}

// startContainer records the cgroup and container, then starts the
// container with our agent as PID 1.
func (b *Backend) startContainer(ctx context.Context, req sandbox.StartRequest, si *sandboxIdentity, layers *image.Layers, rec ledger.Recorder) (sandbox.Handle, error) {
	spec := req.Spec
	cg := b.cgroupPath(req.ID)
	if err := rec.Record(ctx, ledger.Resource{Kind: KindCgroup, Key: cg}); err != nil {
		return nil, err
	}
	if err := rec.Record(ctx, ledger.Resource{Kind: KindContainer, Key: req.ID}); err != nil {
		return nil, err
	}
	// Root mode exists only with a user namespace (pkg/engine).
	rootMode := spec.Root && si.idmap != nil
	sc, err := b.seccompProfile(ctx, req.ID, si.dir, spec, rootMode)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			sc.close()
		}
	}()
	binds, sysfs, err := b.sandboxBinds(ctx, req, si, layers, cg)
	if err != nil {
		return nil, err
	}
	var netSysctls map[string]string
	if req.NetNSPath == "" {
		// libcontainer makes the namespace, inside the sandbox's user
		// namespace: the sandbox's init writes them (pkg/network wrote
		// them into a namespace it made).
		netSysctls = network.SandboxSysctls()
	}
	// The agent's socket is bound here, before its start, and handed to it
	// as descriptor 3: the daemon's first ping connects at once and is
	// answered as soon as the agent serves, instead of polling for a
	// socket that does not exist yet (2–8 ms lost per create, measured).
	// The socket stays root's on the host (mode 0600): only the daemon
	// connects to it; the agent accepts on its descriptor.
	lnFile, err := listenAgent(filepath.Join(si.agentDir, agentSocketName))
	if err != nil {
		return nil, err
	}
	defer lnFile.Close() // PID 1 holds its own copy once started
	rs := &runtime.Spec{
		ID:           req.ID,
		Rootfs:       layers.Rootfs,
		Binds:        binds,
		CgroupPath:   cg,
		NetNSPath:    req.NetNSPath,
		NetSysctls:   netSysctls,
		UsernsPath:   si.usernsPath,
		SysfsPath:    sysfs,
		WritableRoot: rootMode,
		Capabilities: runtime.Capabilities(rootMode),
		Limits: runtime.Limits{
			MemoryBytes: spec.Limits.MemoryBytes, CPUs: spec.Limits.CPUs, Pids: sandboxPids(spec.Limits.Pids),
			IODevice: b.opt.IO.Device, IOReadBPS: b.opt.IO.ReadBPS, IOWriteBPS: b.opt.IO.WriteBPS,
		},
		Seccomp:   sc.profile,
		InitArgs:  agentInitArgs(spec, si.idmap != nil, rootMode),
		InitEnv:   agentInitEnv,
		InitLog:   filepath.Join(si.dir, "agent.log"),
		InitFiles: []*os.File{lnFile},
		Labels:    map[string]string{"sandboxd.id": req.ID},
	}
	if b.opt.Landlock {
		rs.InitArgs = append(rs.InitArgs, agentLandlockArgs(runtime.LandlockPaths(rs))...)
	}
	reg := rtrace.StartRegion(ctx, "container.runtime-start")
	inst, err := b.opt.Runtime.Start(rs)
	reg.End()
	if err != nil {
		return nil, err
	}
	started = true
	unpinUserns(si.usernsPath, b.log)
	crashpoint.Hit(CrashAfterContainer)
	h := b.handle(req.ID, inst, spec.UID)
	h.monitor = sc.monitor
	return h, nil
}

// unpinUserns takes the user namespace's pin away once the sandbox runs:
// its processes hold the namespace from then on, and nothing joins it by
// path again (the runtime did, at the start; execs join PID 1's). Every
// mount on the host is copied into each new container's mount namespace,
// which runc init then walks (making it a slave, finding its root's
// parent in the mount table), and each costs every reader of the mount
// table; one mount fewer per live sandbox is a third of the sandboxes'
// mounts. Best effort: a pin left here goes with the sandbox's dir.
func unpinUserns(path string, log *slog.Logger) {
	if path == "" {
		return
	}
	if err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW); err != nil {
		log.Warn("unpin user namespace", "path", path, "err", err)
		return
	}
	_ = os.Remove(path)
}

// mountVolumes makes the binds of the sandbox's named volumes. Without a
// user namespace the volume's own mount is bound (its ids are the host's,
// which are the sandbox's). With one, each volume gets an idmapped clone of
// its mount under dir/volumes (released with dir, which unmounts what is
// below it): on disk a file keeps the id the sandbox sees, so sandboxes of
// different id ranges share the volume with the same owners.
//
// Security: the clone is nosuid and nodev (and read-only when asked); the
// sandbox never reaches the volume's image or loop device, only the file
// system the daemon mounted, as with its own disk. The destination is
// checked by the engine (no /proc, /sys, /dev, ...) and resolved by the
// runtime inside the sandbox's root.
func mountVolumes(dir string, vols []sandbox.VolumeMount, ns *os.File) ([]runtime.Bind, error) {
	var binds []runtime.Bind
	for i, v := range vols {
		src := v.Source
		if ns != nil {
			vdir := filepath.Join(dir, "volumes")
			if err := os.MkdirAll(vdir, 0o711); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			src = filepath.Join(vdir, strconv.Itoa(i))
			if err := os.Mkdir(src, 0o700); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			if err := userns.MountIdmappedWritable(v.Source, src, ns, v.ReadOnly); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
		}
		binds = append(binds, runtime.Bind{Source: src, Destination: v.Path, ReadOnly: v.ReadOnly})
	}
	return binds, nil
}

// jobOfPid names the job a sandbox process belongs to: the agent's per-job
// cgroup (pkg/agent/server/jobcgroup.go) is the last element of its path.
// Empty for the agent itself or when the process is gone.
func jobOfPid(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.LastIndexByte(line, '/'); i >= 0 && strings.HasPrefix(line[i+1:], "j-") {
			return line[i+1:]
		}
	}
	return ""
}

// listenAgent binds the agent's listening socket at path (replacing a
// leftover of an earlier attempt) and returns it as a file for PID 1.
// Closing the daemon's copy must not unlink the path the agent serves on.
func listenAgent(path string) (*os.File, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	f, err := ln.File()
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	return f, nil
}

// mountDisk mounts the sandbox's writable file system at disk: an ext4
// image on a loop device (image file, loop device and mount each recorded
// first) or, for the memory backing, a tmpfs.
func (b *Backend) mountDisk(ctx context.Context, id, disk string, spec sandbox.Spec, rec ledger.Recorder) error {
	size := spec.Limits.DiskBytes
	inodes := spec.Limits.Inodes
	if inodes <= 0 {
		inodes = storage.DefaultInodes(size)
	}
	if spec.DiskBacking == storage.BackingMemory {
		if err := rec.Record(ctx, ledger.Resource{Kind: KindMount, Key: disk}); err != nil {
			return err
		}
		if err := os.Mkdir(disk, 0o700); err != nil {
			return fmt.Errorf("create disk dir: %w", err)
		}
		return storage.MountMemory(disk, size, inodes)
	}
	img := b.opt.Storage.ImagePath(id)
	if err := rec.Record(ctx, ledger.Resource{Kind: KindImage, Key: img}); err != nil {
		return err
	}
	if b.opt.Pool.Matches(size, inodes) {
		// A ready disk, already attached and mounted in the pool: record
		// its device and the sandbox's mount, then take it over.
		if err := rec.Record(ctx, ledger.Resource{Kind: KindLoop, Key: img}); err != nil {
			return err
		}
		if err := rec.Record(ctx, ledger.Resource{Kind: KindMount, Key: disk}); err != nil {
			return err
		}
		from, err := b.opt.Pool.Take(img)
		if err != nil {
			return err
		}
		if from != "" {
			crashpoint.Hit(CrashAfterImage)
			crashpoint.Hit(CrashAfterLoop)
			return b.opt.Pool.Mount(from, disk)
		}
	}
	if err := b.opt.Storage.CreateImage(ctx, img, size, inodes); err != nil {
		return err
	}
	crashpoint.Hit(CrashAfterImage)
	// The loop device is recorded by its image: its number is known only
	// once attached, and the releaser finds it through sysfs.
	if err := rec.Record(ctx, ledger.Resource{Kind: KindLoop, Key: img}); err != nil {
		return err
	}
	dev, loop, err := storage.Attach(img)
	if err != nil {
		return err
	}
	// Autoclear: once the mount holds the device, closing our descriptor
	// leaves the mount its only user, and unmounting frees the device.
	defer loop.Close()
	crashpoint.Hit(CrashAfterLoop)
	if err := rec.Record(ctx, ledger.Resource{Kind: KindMount, Key: disk}); err != nil {
		return err
	}
	if err := os.Mkdir(disk, 0o700); err != nil {
		return fmt.Errorf("create disk dir: %w", err)
	}
	return storage.MountScratch(dev, disk)
}

func (b *Backend) handle(id string, inst *runtime.Instance, uid int) *handle {
	dir := b.dir(id)
	return &handle{inst: inst, dir: dir, cgroup: b.cgroupPath(id), uid: uid,
		dial: agent.UnixDialer(filepath.Join(dir, "agent", agentSocketName))}
}

// Adopt implements sandbox.Backend: the container must be running with the
// recorded init.
func (b *Backend) Adopt(ctx context.Context, req sandbox.AdoptRequest) (sandbox.Handle, error) {
	inst, err := b.opt.Runtime.Adopt(req.ID)
	if err != nil {
		if errors.Is(err, runtime.ErrNotRunning) {
			return nil, errors.New("sandbox init exited while the daemon was down")
		}
		return nil, fmt.Errorf("cannot load the container: %w", err)
	}
	if req.Identity.PID != 0 && inst.Pid != req.Identity.PID {
		return nil, fmt.Errorf("init pid %d does not match the recorded %d", inst.Pid, req.Identity.PID)
	}
	return b.handle(req.ID, inst, req.Spec.UID), nil
}

// Scan implements sandbox.Backend: libcontainer state, sandbox dirs and
// cgroups named like sandboxes.
func (b *Backend) Scan(ctx context.Context) (map[string][]ledger.Resource, error) {
	out := map[string][]ledger.Resource{}
	isSandbox := isSandboxName
	var errs []error
	// In acquisition order: Release walks extras in the order given, and the
	// container must go before its cgroup, the layers before their dir.
	if ents, err := os.ReadDir(filepath.Join(b.opt.RunDir, "sandboxes")); err != nil && !os.IsNotExist(err) {
		errs = append(errs, fmt.Errorf("list sandbox dirs: %w", err))
	} else {
		for _, e := range ents {
			if isSandbox(e.Name()) {
				d := b.dir(e.Name())
				out[e.Name()] = append(out[e.Name()], ledger.Resource{Kind: KindDir, Key: d})
			}
		}
	}
	images, err := b.scanImages()
	if err != nil {
		errs = append(errs, err)
	}
	for id, img := range images {
		if isSandbox(id) {
			out[id] = append(out[id], ledger.Resource{Kind: KindImage, Key: img}, ledger.Resource{Kind: KindLoop, Key: img})
		}
	}
	for id := range out {
		d := b.dir(id)
		out[id] = append(out[id], ledger.Resource{Kind: KindMount, Key: filepath.Join(d, "disk")}, ledger.Resource{Kind: KindLayers, Key: filepath.Join(d, "layers")})
	}
	if names, err := cgroups.Children(b.opt.CgroupParent); err != nil {
		errs = append(errs, fmt.Errorf("list cgroups: %w", err))
	} else {
		for _, n := range names {
			if isSandbox(n) {
				out[n] = append(out[n], ledger.Resource{Kind: KindCgroup, Key: b.cgroupPath(n)})
			}
		}
	}
	if p := b.opt.Userns; p != nil {
		// Ranges are acquired first: listed first, then reversed below,
		// released last.
		if held, err := p.Ranges.IDRanges(ctx); err != nil {
			errs = append(errs, err)
		} else {
			for id := range held {
				out[id] = append([]ledger.Resource{{Kind: KindUserns, Key: id}}, out[id]...)
			}
		}
	}
	if ids, err := b.opt.Runtime.List(); err != nil {
		errs = append(errs, fmt.Errorf("list runtime state: %w", err))
	} else {
		for _, id := range ids {
			if isSandbox(id) {
				out[id] = append(out[id], ledger.Resource{Kind: KindContainer, Key: id})
			}
		}
	}
	// Reverse each list so that Release, which takes extras in the order
	// given, releases them newest first like recorded ones.
	for _, rs := range out {
		slices.Reverse(rs)
	}
	return out, errors.Join(errs...)
}

// scanImages lists the disk image files of the store by sandbox id, and
// the loop devices backed by a file of the store even if the file is
// gone. What it could list is returned with the error.
func (b *Backend) scanImages() (map[string]string, error) {
	var errs []error
	images, err := b.opt.Storage.Images()
	if err != nil {
		errs = append(errs, err)
		images = map[string]string{}
	}
	devs, err := storage.LoopDevices()
	if err != nil {
		errs = append(errs, fmt.Errorf("list loop devices: %w", err))
	}
	for _, backing := range devs {
		if filepath.Dir(backing) != b.opt.Storage.Dir() {
			continue
		}
		if id := strings.TrimSuffix(filepath.Base(backing), ".img"); isSandboxName(id) && images[id] == "" {
			images[id] = backing
		}
	}
	return images, errors.Join(errs...)
}

// isSandboxName tells a sandbox's name among the files, cgroups and
// containers the backend scans.
func isSandboxName(name string) bool { return strings.HasPrefix(name, "sb-") }

// handle is one container sandbox.
type handle struct {
	inst    *runtime.Instance
	monitor *seccomp.Monitor // nil without diagnostics, or once adopted
	dir     string
	cgroup  string
	uid     int
	dial    agent.Dialer
}

// Capabilities implements sandbox.Handle: every container can do the same.
func (h *handle) Capabilities() sandbox.Capabilities { return capabilities }

func (h *handle) Done() <-chan struct{}   { return h.inst.Done() }
func (h *handle) ExitDescription() string { return h.inst.ExitDescription() }

// OnExit implements sandbox.ExitNotifier (runtime.Instance.OnExit).
func (h *handle) OnExit(f func())    { h.inst.OnExit(f) }
func (h *handle) CgroupPath() string { return h.cgroup }
func (h *handle) OOMKills() (uint64, error) {
	return cgroups.OOMKills(h.cgroup)
}

func (h *handle) Pause(context.Context) error  { return h.inst.Pause() }
func (h *handle) Resume(context.Context) error { return h.inst.Resume() }
func (h *handle) Paused() (bool, error)        { return h.inst.Paused() }

// daemonFiles are the root file system's paths that Start writes for each
// sandbox (writeIdentity, resolv.conf) and the runtime's mount points for
// the agent (below /.sandboxd, made in the upper layer by libcontainer): a
// snapshot's copies of them belong to another sandbox and are not restored,
// and replacing a mount point through the host's view of the overlay would
// detach the bind mount the running sandbox has there.
var daemonFiles = []string{"etc/hosts", "etc/hostname", "etc/resolv.conf", strings.TrimPrefix(filepath.Dir(agentBinaryInside), "/")}

// WritableDirs implements sandbox.WritableState (the layout is
// image.PrepareLayers').
func (h *handle) WritableDirs() sandbox.WritableDirs {
	disk := filepath.Join(h.dir, "disk")
	d := sandbox.WritableDirs{
		Upper: filepath.Join(disk, "upper"), Rootfs: filepath.Join(h.dir, "layers", "rootfs"),
		Workspace: filepath.Join(disk, "workspace"), Tmp: filepath.Join(disk, "tmp"),
		DaemonFiles: daemonFiles, UID: h.uid,
	}
	// The init's own mapping is the authority (an adopted sandbox's range
	// is known to the store only): "0 HOST SIZE", or the identity map
	// ("0 0 4294967295") without a user namespace.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", h.inst.Pid)); err == nil {
		var in, host, size int64
		if n, _ := fmt.Sscan(string(b), &in, &host, &size); n == 3 && in == 0 && host != 0 {
			d.IDBase, d.IDSize = int(host), int(size)
		}
	}
	return d
}

// snapshotIDs is the id range a fork's files are written with.
func snapshotIDs(m *userns.IDMap) storage.IDRange {
	if m == nil {
		return storage.IDRange{}
	}
	return storage.IDRange{Base: int(m.HostID), Size: int(m.Size)}
}

// BlockedSyscalls implements sandbox.SyscallReporter.
func (h *handle) BlockedSyscalls(jobID string) map[string]uint64 {
	if h.monitor == nil {
		return nil
	}
	return h.monitor.Take(jobID)
}

func (h *handle) Dial(ctx context.Context) (net.Conn, error) { return h.dial(ctx) }

func (h *handle) Identity() sandbox.Identity {
	return sandbox.Identity{PID: h.inst.Pid, StartTime: h.inst.StartTime}
}

// Usage reads the cgroup's counters and the writable layer's size.
func (h *handle) Usage(ctx context.Context) (*sandbox.Usage, error) {
	u, err := cgroups.ReadUsage(h.cgroup)
	if err != nil {
		return nil, err
	}
	out := &sandbox.Usage{
		MemoryBytes: u.MemoryBytes, MemoryMaxBytes: u.MemoryMaxBytes, CPUSeconds: u.CPUSeconds,
		Pids: u.Pids, OOMKills: u.OOMKills, CPUThrottledSec: u.CPUThrottledSec,
	}
	if d, n, err := storage.Usage(filepath.Join(h.dir, "disk")); err == nil {
		out.DiskBytes, out.Inodes = d, n
	}
	return out, nil
}

// writeIdentity gives the sandbox a hosts file naming itself. The rootfs is the
// overlay's merged dir, so the write lands in the sandbox's own upper layer.
// owner is the host uid (and gid) of the sandbox's root.
func writeIdentity(rootfs, id string, owner int) error {
	hosts := "127.0.0.1\tlocalhost " + id + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	files := map[string]string{"etc/hosts": hosts, "etc/hostname": id + "\n"}
	for name, content := range files {
		p := filepath.Join(rootfs, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /%s: %w", name, err)
		}
		if err := os.Lchown(p, owner, owner); err != nil {
			return fmt.Errorf("write /%s: %w", name, err)
		}
	}
	return nil
}

// mountNetSysfs mounts at dir (created) a read-only sysfs as seen from the
// network namespace at nsPath (its /sys/class/net lists that namespace's
// devices), from a thread of the daemon that joined it and is then
// discarded (network.InNetNS). Released with the sandbox's dir.
func mountNetSysfs(nsPath, dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("sysfs for the sandbox's network: %w", err)
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("sysfs for the sandbox's network: %w", err)
	}
	defer ns.Close()
	return network.InNetNS(ns, func() error {
		if err := unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount sysfs for the sandbox's network: %w", err)
		}
		return nil
	})
}

// addSearch lets everyone traverse dir (o+x, never read): the sandbox's
// init, an unprivileged host uid, resolves paths below it.
func addSearch(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 != 0 {
		return nil
	}
	return os.Chmod(dir, fi.Mode().Perm()|0o011)
}
