package engine

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkIdleMemory holds SANDBOXD_BENCH_N (default 20) idle shell
// sandboxes and reports what each costs: the charge of the sandboxes'
// cgroups (their processes' anonymous memory, page tables, kernel stacks
// and the page cache they brought in) and the proportional set size of
// their processes (the agent, its spare job helper) from smaps_rollup,
// which counts a page shared by n processes as 1/n of a page in each.
// It is the engine-level, quick form of test/e2e's BenchmarkDensity
// (memory only, no REST, no MemAvailable, which other tenants move).
// Run with: go test -tags seccomp -run '^$' -bench IdleMemory -benchtime 1x ./pkg/engine
func BenchmarkIdleMemory(b *testing.B) {
	requireRoot(b)
	n := 20
	if s := os.Getenv("SANDBOXD_BENCH_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("SANDBOXD_BENCH_N=%q: want a positive number of sandboxes", s)
		}
		n = v
	}
	env := newTestEngine(b, func(c *config.Config) { c.Sandbox.MaxSandboxes = max(c.Sandbox.MaxSandboxes, n) })
	ctx := context.Background()
	ids := make([]string, 0, n)
	for range n {
		info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	// SANDBOXD_BENCH_EXECS commands per sandbox first (each writing ~100 KiB
	// of output): an idle sandbox that has been used, whose agent's heap
	// has grown towards its collector's goal.
	if s := os.Getenv("SANDBOXD_BENCH_EXECS"); s != "" {
		k, err := strconv.Atoi(s)
		if err != nil || k < 0 {
			b.Fatalf("SANDBOXD_BENCH_EXECS=%q: want a number of commands", s)
		}
		for _, id := range ids {
			for range k {
				res, err := env.Exec(ctx, ExecRequest{SandboxID: id, Argv: []string{"seq", "1", "20000"}}, nil)
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("exec seq: %v %+v", err, res)
				}
			}
		}
		// Idle means idle for a while: past the agent's trim after its
		// last request (pkg/agent/server idleTrimDelay, 1 s).
		time.Sleep(2 * time.Second)
	}
	// Idle: every agent has answered and prepared what it prepares ahead
	// (its spare job helper) once the task count stops changing.
	parent := env.cfg.Sandbox.CgroupParent
	var procs []int
	for deadline, last := time.Now().Add(10*time.Second), -1; time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // a sampling interval, not synchronisation
		var err error
		if procs, err = cgroups.Procs(parent); err != nil {
			b.Fatal(err)
		}
		if len(procs) == last {
			break
		}
		last = len(procs)
	}
	if len(procs) < n {
		b.Fatalf("%d processes in %s for %d sandboxes", len(procs), parent, n)
	}
	u, err := cgroups.ReadUsage(parent)
	if err != nil {
		b.Fatal(err)
	}
	var pss, anon, threads int64
	for _, pid := range procs {
		st := procFields(b, fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:", "Anonymous:")
		pss += st[0]
		anon += st[1]
		threads += procFields(b, fmt.Sprintf("/proc/%d/status", pid), "Threads:")[0]
	}
	b.ReportMetric(float64(u.MemoryBytes)/(1<<20)/float64(n), "cgroup-MiB/sandbox")
	b.ReportMetric(float64(pss)/float64(n), "pss-KiB/sandbox")
	b.ReportMetric(float64(anon)/float64(n), "anon-KiB/sandbox")
	b.ReportMetric(float64(len(procs))/float64(n), "procs/sandbox")
	b.ReportMetric(float64(threads)/float64(n), "threads/sandbox")
	b.ReportMetric(0, "ns/op") // the figures above are the result
	if dir := os.Getenv("SANDBOXD_BENCH_MEMSTAT"); dir != "" {
		// The breakdown of one sandbox, for the reader (docs/ARCHITECTURE.md).
		dumpMemory(b, dir, procs)
		for _, d := range cgroups.Dirs(parent) {
			if data, err := os.ReadFile(filepath.Join(d, "memory.stat")); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "memory.stat"), data, 0o644)
			}
			if data, err := os.ReadFile(filepath.Join(d, "memory.kmem.usage_in_bytes")); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "kmem"), data, 0o644)
			}
		}
	}
}

// procFields reads the first number of each "Key: value" line named.
func procFields(b *testing.B, path string, keys ...string) []int64 {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return make([]int64, len(keys)) // the process ended meanwhile
		}
		b.Fatal(err)
	}
	defer f.Close()
	out := make([]int64, len(keys))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for i, k := range keys {
			if rest, ok := strings.CutPrefix(sc.Text(), k); ok {
				v, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				out[i] = v
			}
		}
	}
	return out
}

// dumpMemory copies the smaps_rollup and status of procs into dir.
func dumpMemory(b *testing.B, dir string, procs []int) {
	for _, pid := range procs {
		for _, f := range []string{"smaps_rollup", "status", "smaps", "cmdline", "cgroup"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.%s", pid, f)), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		// Where each thread waits: the kernel's stack of every task.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stack", pid))
		var all []byte
		for _, t := range tasks {
			data, _ := os.ReadFile(t)
			all = append(append(all, t+"\n"...), data...)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.threads", pid)), all, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
