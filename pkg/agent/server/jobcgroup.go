package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Security boundary: a command cannot outlive its timeout or a kill.
//
// Every job runs in its own child cgroup of the sandbox's cgroup. The host
// daemon bind-mounts the sandbox's cgroup directory of each hierarchy it
// uses into the sandbox (under --cgroups, writable only by root, and the
// sandbox's commands never are root with capabilities); the sandbox has its
// own cgroup namespace rooted there, so the agent can create children but
// never reach a cgroup outside the sandbox.
//
// Placement is race-free: the agent forks a copy of itself (the job-exec
// helper, still root with the agent's capabilities, running only our code),
// which writes itself into the job's cgroup.procs in every hierarchy, then
// drops to the command's uid/gid (losing every capability) and execs the
// command. A process cannot fork before it runs, so nothing the command
// does — setsid, double fork, daemonising — starts outside the cgroup.
// clone3(CLONE_INTO_CGROUP) would save the helper's exec but covers v2 only
// and is refused by the sandbox's seccomp profile (ENOSYS, as in Docker's:
// its namespace flags cannot be filtered), which binds the agent as well.
//
// Killing a job writes cgroup.kill (v2: the kernel kills every task in the
// cgroup, including ones forking at that moment) or, with v1 only, freezes
// the cgroup, SIGKILLs every task and thaws it.
//
// Security boundary: a fork bomb cannot starve the agent. The sandbox's
// pids.max (set by the host, out of the agent's reach) is the commands'
// limit plus agent.PidsReserve; every job's processes are in one cgroup,
// jobsCgroup, whose pids.max is the commands' limit (--jobs-pids). The
// agent's own threads and helpers count against the reserve only: a Go
// program that cannot start a thread when it needs one dies, and the
// sandbox with it. On v2 the jobs' own cgroups are children of jobsCgroup;
// on v1 it is a cgroup of the pids hierarchy that each job joins beside
// its own freezer and cpuacct ones (one more cgroup.procs write per job,
// right after its first: no exec cost beyond the noise in bench-compare).
// A process moved into jobsCgroup is charged even when it is full (the
// kernel never refuses a migration): a command started in a sandbox full
// of a fork bomb's processes still runs, though it cannot fork. Root of a
// root-mode sandbox can raise jobsCgroup's limit into the reserve, and so
// starve only its own agent.
//
// Where a unified hierarchy exists (v2, or hybrid's controller-less
// /sys/fs/cgroup/unified) the job's cgroup there is all it gets: its core
// files alone give cgroup.kill, cgroup.events and cpu.stat's usage_usec.
// v1 cgroups are made only on a host without one, and never in the v1
// memory hierarchy: a task's first move into a fresh v1 memory cgroup
// waits for an RCU grace period (measured 1–22 ms per exec on this
// project's hybrid host, most of an exec of `true`). A job's memory peak
// then comes from wait4's rusage; its OOM kills show in the sandbox's
// memory cgroup, where the task died.
type jobCgroups struct {
	unified string            // the parent of the jobs' cgroups in the v2 hierarchy; "" without
	v1      map[string]string // hierarchy name → the sandbox's cgroup there
	// pidsJobs is the cgroup of the v1 pids hierarchy that every job's
	// processes share (see jobsCgroup); "" without.
	pidsJobs string
}

// v1Hierarchies are the v1 controllers a job gets a cgroup in when the
// host has no unified hierarchy: the freezer to kill it, cpuacct to
// measure it.
var v1Hierarchies = []string{"cpuacct", "freezer"}

// jobsCgroup is the cgroup, a child of the sandbox's, that holds every
// job's processes and limits how many tasks they may have together.
const jobsCgroup = "jobs"

// newJobCgroups finds the delegated hierarchies below root: root itself
// when it is a v2 cgroup, else root/unified and root/<controller>, and
// makes jobsCgroup with pids.max jobsPids (0: no limit of the jobs' own).
// An empty root disables per-job cgroups (the agent on a host, in tests).
func newJobCgroups(root string, jobsPids int64) (*jobCgroups, error) {
	if root == "" {
		return nil, nil
	}
	c := &jobCgroups{v1: map[string]string{}}
	if isCgroup(root) {
		c.unified = root
		if err := c.enableJobControllers(jobsPids); err != nil {
			return nil, err
		}
		return c, nil
	}
	if d := filepath.Join(root, "unified"); isCgroup(d) {
		c.unified = d
	} else {
		for _, h := range v1Hierarchies {
			if d := filepath.Join(root, h); isCgroup(d) {
				c.v1[h] = d
			}
		}
		if c.v1["freezer"] == "" {
			return nil, fmt.Errorf("--cgroups %s: neither a unified hierarchy nor a v1 freezer to kill jobs with", root)
		}
	}
	if d := filepath.Join(root, "pids"); isCgroup(d) {
		jobs, err := makeJobsCgroup(d, jobsPids)
		if err != nil {
			return nil, err
		}
		c.pidsJobs = jobs
	}
	return c, nil
}

func isCgroup(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	return err == nil
}

// makeJobsCgroup creates parent's jobsCgroup (or finds it, for an agent
// started again in the same cgroup) with pids.max limit (0: max).
func makeJobsCgroup(parent string, limit int64) (string, error) {
	d := filepath.Join(parent, jobsCgroup)
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("job cgroups: create %s: %w", d, err)
	}
	if limit > 0 {
		if err := os.WriteFile(filepath.Join(d, "pids.max"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
			return "", fmt.Errorf("job cgroups: limit the jobs to %d tasks: %w", limit, err)
		}
	}
	return d, nil
}

// jobControllers are the v2 controllers a job's cgroup gets: memory, so
// that memory.peak and memory.events are the job's own (a job's CPU time,
// cpu.stat, is there without any controller).
var jobControllers = []string{"memory"}

// agentLeaf is the child cgroup the agent moves itself into on v2.
const agentLeaf = "agent"

// enableJobControllers makes jobsCgroup in the sandbox's v2 cgroup, with
// pids.max jobsPids, and enables jobControllers for its children, the
// jobs' own cgroups. cgroup v2 lets a cgroup that holds processes enable
// no domain controller for its children ("no internal processes"), and the
// agent starts in the sandbox's cgroup; so it first moves itself (at start
// the only process there) into a leaf child, agentLeaf, as systemd and
// container inits do. Without this a job's cgroup on v2 has no memory
// files and its memory peak is unknown, and the agent's threads share the
// commands' pids limit. Hybrid hosts have no controller in the unified
// tree (a job's memory peak comes from wait4's rusage there, its pids
// limit from the v1 pids hierarchy): nothing to do.
func (c *jobCgroups) enableJobControllers(jobsPids int64) error {
	b, err := os.ReadFile(filepath.Join(c.unified, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("job cgroups: %w", err)
	}
	available := strings.Fields(string(b))
	var perJob []string
	for _, ctl := range jobControllers {
		if slices.Contains(available, ctl) {
			perJob = append(perJob, "+"+ctl)
		}
	}
	enable := perJob
	if !slices.Contains(available, "pids") {
		jobsPids = 0
	} else if jobsPids > 0 {
		enable = append(slices.Clip(enable), "+pids")
	}
	if len(enable) == 0 {
		return nil
	}
	leaf := filepath.Join(c.unified, agentLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("job cgroups: create the agent's cgroup: %w", err)
	}
	for _, pid := range readPids(filepath.Join(c.unified, "cgroup.procs")) {
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("job cgroups: move pid %d into the agent's cgroup: %w", pid, err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.unified, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0); err != nil {
		return fmt.Errorf("job cgroups: enable %s: %w", strings.Join(enable, " "), err)
	}
	jobs, err := makeJobsCgroup(c.unified, jobsPids)
	if err != nil {
		return err
	}
	if len(perJob) > 0 {
		if err := os.WriteFile(filepath.Join(jobs, "cgroup.subtree_control"), []byte(strings.Join(perJob, " ")), 0); err != nil {
			return fmt.Errorf("job cgroups: enable %s for the jobs: %w", strings.Join(perJob, " "), err)
		}
	}
	c.unified = jobs
	return nil
}

// jobCgroup is one job's cgroup in every delegated hierarchy.
type jobCgroup struct {
	unified  string
	v1       map[string]string
	pidsJobs string // shared by every job: never removed with one
}

// create makes the cgroups of job id.
func (c *jobCgroups) create(id string) (*jobCgroup, error) {
	g := &jobCgroup{v1: map[string]string{}, pidsJobs: c.pidsJobs}
	mk := func(parent string) (string, error) {
		d := filepath.Join(parent, id)
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", fmt.Errorf("create job cgroup: %w", err)
		}
		return d, nil
	}
	var err error
	if c.unified != "" {
		if g.unified, err = mk(c.unified); err != nil {
			return nil, err
		}
	}
	for h, parent := range c.v1 {
		d, err := mk(parent)
		if err != nil {
			g.remove()
			return nil, err
		}
		g.v1[h] = d
	}
	return g, nil
}

// procsFiles lists the cgroup.procs files a job's process writes itself
// into (see JobExecHelper).
func (g *jobCgroup) procsFiles() []string {
	var out []string
	if g.unified != "" {
		out = append(out, filepath.Join(g.unified, "cgroup.procs"))
	}
	for _, h := range v1Hierarchies {
		if d := g.v1[h]; d != "" {
			out = append(out, filepath.Join(d, "cgroup.procs"))
		}
	}
	if g.pidsJobs != "" {
		out = append(out, filepath.Join(g.pidsJobs, "cgroup.procs"))
	}
	return out
}

// kill SIGKILLs every process in the job's cgroup and waits (briefly) until
// it is empty.
func (g *jobCgroup) kill() error {
	if g.unified != "" {
		if err := os.WriteFile(filepath.Join(g.unified, "cgroup.kill"), []byte("1"), 0); err != nil {
			return fmt.Errorf("cgroup.kill: %w", err)
		}
	} else if fz := g.v1["freezer"]; fz != "" {
		if err := freezeKill(fz); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for !g.empty() {
		if time.Now().After(deadline) {
			return errors.New("job cgroup still populated 2s after SIGKILL")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// freezeKill kills a v1 cgroup's tasks while it is frozen, so none can fork
// between the listing and the signal.
func freezeKill(dir string) error {
	state := filepath.Join(dir, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
		return fmt.Errorf("freeze job cgroup: %w", err)
	}
	for range 100 {
		b, err := os.ReadFile(state)
		if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	self := os.Getpid()
	for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
		if pid != self {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	// SIGKILL takes effect once the tasks run again.
	if err := os.WriteFile(state, []byte("THAWED"), 0); err != nil {
		return fmt.Errorf("thaw job cgroup: %w", err)
	}
	return nil
}

func readPids(file string) []int {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// empty reports whether no process is left in the job's cgroup.
func (g *jobCgroup) empty() bool {
	if g.unified != "" {
		b, err := os.ReadFile(filepath.Join(g.unified, "cgroup.events"))
		if err != nil {
			return true // gone
		}
		return strings.Contains(string(b), "populated 0")
	}
	for _, d := range g.v1 {
		if len(readPids(filepath.Join(d, "cgroup.procs"))) > 0 {
			return false
		}
	}
	return true
}

// usage reads the job's CPU time, and its peak memory and OOM kills where
// the job has a memory controller of its own (v2 with memory enabled for
// job cgroups); zero when unknown.
func (g *jobCgroup) usage() (cpuSeconds float64, memoryPeak, oomKills uint64) {
	if g.unified != "" {
		if b, err := os.ReadFile(filepath.Join(g.unified, "cpu.stat")); err == nil {
			if v, ok := statField(string(b), "usage_usec"); ok {
				cpuSeconds = float64(v) / 1e6
			}
		}
		// Only when the memory controller is enabled for job cgroups.
		if v, ok := readUint(filepath.Join(g.unified, "memory.peak")); ok {
			memoryPeak = v
		}
		if b, err := os.ReadFile(filepath.Join(g.unified, "memory.events")); err == nil {
			oomKills, _ = statField(string(b), "oom_kill")
		}
	}
	if d := g.v1["cpuacct"]; d != "" && cpuSeconds == 0 {
		if v, ok := readUint(filepath.Join(d, "cpuacct.usage")); ok {
			cpuSeconds = float64(v) / 1e9
		}
	}
	return cpuSeconds, memoryPeak, oomKills
}

func statField(s, key string) (uint64, bool) {
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func readUint(file string) (uint64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// remove deletes the job's cgroups; it fails while processes are left.
func (g *jobCgroup) remove() error {
	var errs []error
	rm := func(d string) {
		if d == "" {
			return
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, d := range g.v1 {
		rm(d)
	}
	rm(g.unified)
	return errors.Join(errs...)
}
