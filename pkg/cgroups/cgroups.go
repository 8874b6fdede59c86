// Package cgroups manages the daemon's parent cgroup and reads per-sandbox
// usage, on cgroup v2 (unified), v1 and hybrid hosts alike.
//
// Limits themselves are written by libcontainer when a sandbox starts (see
// pkg/runtime); this package only creates the parent under which every sandbox
// cgroup lives, answers "is it usable", reads statistics and finds leftovers.
// All paths are absolute cgroup paths ("/mcp-sandboxd/sb-1234"), the same on
// every hierarchy, so v1 and v2 share one layout.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	cg "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Root is where cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Mode is the host's cgroup layout.
type Mode string

// The layouts we support.
const (
	ModeUnified Mode = "v2"
	ModeHybrid  Mode = "hybrid"
	ModeLegacy  Mode = "v1"
	ModeNone    Mode = "unavailable"
)

// HostMode reports the host's cgroup layout.
func HostMode() Mode {
	switch cg.Mode() {
	case cg.Unified:
		return ModeUnified
	case cg.Hybrid:
		return ModeHybrid
	case cg.Legacy:
		return ModeLegacy
	default:
		return ModeNone
	}
}

// Usage is a sandbox's resource usage as the kernel accounts it.
type Usage struct {
	MemoryBytes     uint64  `json:"memory_bytes"`
	MemoryMaxBytes  uint64  `json:"memory_max_bytes,omitempty"` // high-water mark (v1 only)
	CPUSeconds      float64 `json:"cpu_seconds"`
	Pids            uint64  `json:"pids"`
	OOMKills        uint64  `json:"oom_kills"`
	CPUThrottledSec float64 `json:"cpu_throttled_seconds,omitempty"`
}

// EnsureParent creates the daemon's parent cgroup (and, on v2, enables the
// controllers sandboxes need in it) if it does not exist yet.
func EnsureParent(parent string) error {
	if err := checkPath(parent); err != nil {
		return err
	}
	switch HostMode() {
	case ModeUnified:
		m, err := cgroup2.NewManager(Root, parent, &cgroup2.Resources{})
		if err != nil {
			return fmt.Errorf("create cgroup %s: %w", parent, err)
		}
		ctrls, err := m.RootControllers()
		if err != nil {
			return fmt.Errorf("read controllers of %s: %w", parent, err)
		}
		if err := m.ToggleControllers(ctrls, cgroup2.Enable); err != nil {
			return fmt.Errorf("enable controllers in %s: %w", parent, err)
		}
		return nil
	case ModeHybrid, ModeLegacy:
		if _, err := cgroup1.New(cgroup1.StaticPath(parent), &specs.LinuxResources{}); err != nil {
			return fmt.Errorf("create cgroup %s: %w", parent, err)
		}
		if HostMode() == ModeHybrid {
			// libcontainer also joins sandboxes to the unified hierarchy for
			// process tracking; keep the parent there too.
			if err := os.MkdirAll(filepath.Join(Root, "unified", parent), 0o755); err != nil {
				return fmt.Errorf("create unified cgroup %s: %w", parent, err)
			}
		}
		return nil
	default:
		return errors.New("no cgroup hierarchy is mounted at " + Root)
	}
}

// CheckParent verifies that the parent cgroup exists and accepts new children
// in every hierarchy sandboxes use; readiness reports its error.
func CheckParent(parent string) error {
	for _, dir := range hierarchyDirs(parent) {
		st, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("cgroup parent: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("cgroup parent %s is not a directory", dir)
		}
		probe, err := os.MkdirTemp(dir, ".probe-")
		if err != nil {
			return fmt.Errorf("cgroup parent %s is not writable: %w", dir, err)
		}
		if err := os.Remove(probe); err != nil {
			return fmt.Errorf("remove probe cgroup %s: %w", probe, err)
		}
	}
	return nil
}

// hierarchyDirs lists the directories that make up cgroup path p on this host.
func hierarchyDirs(p string) []string {
	switch HostMode() {
	case ModeUnified:
		return []string{filepath.Join(Root, p)}
	case ModeHybrid, ModeLegacy:
		var dirs []string
		for _, c := range []string{"memory", "cpu", "pids"} {
			dirs = append(dirs, filepath.Join(Root, c, p))
		}
		return dirs
	}
	return nil
}

// Exists reports whether cgroup path p exists in any hierarchy.
func Exists(p string) bool {
	return len(Dirs(p)) > 0
}

// Dirs lists the directories of cgroup path p that exist, in every mounted
// hierarchy: one on a unified host; on v1 and hybrid hosts one per
// controller plus name=systemd and the hybrid unified tree. Tests and
// leftover checks read cgroups through it so they hold on every layout.
func Dirs(p string) []string {
	var dirs []string
	for _, dir := range allDirs(p) {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// allDirs lists p in every mounted hierarchy, including name=systemd and the
// hybrid unified tree: everything libcontainer may have created.
func allDirs(p string) []string {
	if HostMode() == ModeUnified {
		return []string{filepath.Join(Root, p)}
	}
	ents, err := os.ReadDir(Root)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() || e.Type()&os.ModeSymlink != 0 {
			// Skip the comma-joined symlinks (cpu,cpuacct); their targets are listed.
			if e.Type()&os.ModeSymlink != 0 {
				continue
			}
			dirs = append(dirs, filepath.Join(Root, e.Name(), p))
		}
	}
	return dirs
}

// Children lists the names of the direct child cgroups of parent, in any hierarchy.
func Children(parent string) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, dir := range allDirs(parent) {
		ents, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				names = append(names, e.Name())
			}
		}
	}
	return names, nil
}

// Remove kills every process left in cgroup p and removes it from every
// hierarchy. Used for leftovers whose sandbox is gone (garbage collection).
func Remove(p string) error {
	if err := checkPath(p); err != nil {
		return err
	}
	var errs []error
	for _, dir := range allDirs(p) {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		// SIGKILL is delivered asynchronously: a cgroup can only be removed
		// once its last task has exited.
		deadline := time.Now().Add(5 * time.Second)
		for killProcs(dir) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := removeTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killProcs sends SIGKILL to every process in dir and below and returns how
// many it found.
func killProcs(dir string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				_ = syscallKill(pid)
				n++
			}
		}
		return nil
	})
	return n
}

// removeTree removes cgroup directories bottom-up (rmdir only: cgroupfs
// directories cannot be removed with unlink semantics).
func removeTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// Procs lists the pids of the processes in cgroup p and its descendants:
// on v2 a sandbox's processes live in child cgroups (the agent's own leaf
// and one per job, see pkg/agent/server/jobcgroup.go), on v1 in the pids
// hierarchy's p (jobs get no pids cgroup there).
func Procs(p string) ([]int, error) {
	dir := filepath.Join(Root, p)
	if HostMode() != ModeUnified {
		dir = filepath.Join(Root, "pids", p)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return nil, err
	}
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // a job's cgroup removed while we walk
			}
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// ReadUsage reads the usage of cgroup p.
func ReadUsage(p string) (Usage, error) {
	var u Usage
	switch HostMode() {
	case ModeUnified:
		m, err := cgroup2.Load(p)
		if err != nil {
			return u, err
		}
		st, err := m.Stat()
		if err != nil {
			return u, fmt.Errorf("cgroup stats of %s: %w", p, err)
		}
		if st.Memory != nil {
			u.MemoryBytes = st.Memory.Usage
		}
		if st.CPU != nil {
			u.CPUSeconds = float64(st.CPU.UsageUsec) / 1e6
			u.CPUThrottledSec = float64(st.CPU.ThrottledUsec) / 1e6
		}
		if st.Pids != nil {
			u.Pids = st.Pids.Current
		}
		if st.MemoryEvents != nil {
			u.OOMKills = st.MemoryEvents.OomKill
		}
		return u, nil
	case ModeHybrid, ModeLegacy:
		c, err := cgroup1.Load(cgroup1.StaticPath(p))
		if err != nil {
			return u, fmt.Errorf("load cgroup %s: %w", p, err)
		}
		st, err := c.Stat(cgroup1.IgnoreNotExist)
		if err != nil {
			return u, fmt.Errorf("cgroup stats of %s: %w", p, err)
		}
		if st.Memory != nil && st.Memory.Usage != nil {
			u.MemoryBytes = st.Memory.Usage.Usage
			u.MemoryMaxBytes = st.Memory.Usage.Max
		}
		if st.CPU != nil && st.CPU.Usage != nil {
			u.CPUSeconds = float64(st.CPU.Usage.Total) / 1e9
		}
		if st.CPU != nil && st.CPU.Throttling != nil {
			u.CPUThrottledSec = float64(st.CPU.Throttling.ThrottledTime) / 1e9
		}
		if st.Pids != nil {
			u.Pids = st.Pids.Current
		}
		if st.MemoryOomControl != nil {
			u.OOMKills = st.MemoryOomControl.OomKill
		}
		return u, nil
	}
	return u, errors.New("cgroups unavailable")
}

// OOMKills reads only the OOM-kill counter of cgroup p; cheaper than ReadUsage
// and called around every command to attribute SIGKILLs to the OOM killer.
func OOMKills(p string) (uint64, error) {
	var file, key string
	if HostMode() == ModeUnified {
		file, key = filepath.Join(Root, p, "memory.events"), "oom_kill"
	} else {
		file, key = filepath.Join(Root, "memory", p, "memory.oom_control"), "oom_kill"
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, nil
}

func checkPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("cgroup path %q must be absolute, clean and not the root", p)
	}
	return nil
}

// BlockDeviceOf returns "major:minor" of the whole disk that holds path, the
// device block I/O throttles apply to (a partition's requests are accounted
// to its disk's queue).
func BlockDeviceOf(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	sys, err := filepath.EvalSymlinks(filepath.Join("/sys/dev/block", dev))
	if err != nil {
		return "", fmt.Errorf("%s is not on a block device (%s): %w", path, dev, err)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(sys), "dev"))
		if err != nil {
			return "", fmt.Errorf("disk of partition %s: %w", dev, err)
		}
		dev = strings.TrimSpace(string(parent))
	}
	return dev, nil
}

// IOControllerAvailable reports whether block I/O can be throttled here: the
// v1 blkio hierarchy, or io in the v2 root's controllers.
func IOControllerAvailable() bool {
	if HostMode() == ModeUnified {
		data, err := os.ReadFile(filepath.Join(Root, "cgroup.controllers"))
		return err == nil && strings.Contains(" "+string(data)+" ", " io ")
	}
	_, err := os.Stat(filepath.Join(Root, "blkio"))
	return err == nil
}

// DelegatedDirs lists, by name, the host directories of cgroup p that a
// sandbox's agent gets to create per-job cgroups in: "unified" (the v2
// hierarchy, or hybrid's unified tree), or on a legacy host without one
// the v1 "cpuacct" and "freezer" hierarchies; and on either v1 host the
// "pids" hierarchy, for the cgroup that limits the jobs' tasks together.
// On a unified host the one entry is "" (the cgroup itself). The v1
// memory hierarchy is never delegated: why is in pkg/agent/server's
// jobCgroups.
func DelegatedDirs(p string) map[string]string {
	switch HostMode() {
	case ModeUnified:
		return map[string]string{"": filepath.Join(Root, p)}
	case ModeHybrid:
		out := map[string]string{"unified": filepath.Join(Root, "unified", p)}
		if _, err := os.Stat(filepath.Join(Root, "pids")); err == nil {
			out["pids"] = filepath.Join(Root, "pids", p)
		}
		return out
	case ModeLegacy:
		out := map[string]string{}
		for _, c := range []string{"cpuacct", "freezer", "pids"} {
			if _, err := os.Stat(filepath.Join(Root, c)); err == nil {
				out[c] = filepath.Join(Root, c, p)
			}
		}
		return out
	}
	return nil
}

// Delegate hands cgroup directory dir (one of DelegatedDirs) to uid:gid, the
// host ids of a sandbox's root in its user namespace, the way systemd
// delegates a cgroup to an unprivileged manager: the directory (to create
// and remove children) and the files that move processes and enable
// controllers below it. Every limit file stays root's, so the sandbox can
// neither raise its own limits nor reach outside its cgroup (which its
// cgroup namespace hides anyway).
func Delegate(dir string, uid, gid int) error {
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("delegate cgroup %s: %w", dir, err)
	}
	for _, f := range []string{"cgroup.procs", "tasks", "cgroup.threads", "cgroup.subtree_control"} {
		if err := os.Chown(filepath.Join(dir, f), uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delegate cgroup %s: %w", dir, err)
		}
	}
	return nil
}
