package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/engineenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// The figures of issue 24 that need a real daemon (make bench prints them
// with the engine's in one table, scripts/bench-table.sh): the REST
// lifecycle and the density and throughput of many idle sandboxes. Both
// run the default sandbox protections (user namespace, disk, seccomp with
// diagnostics, per-job cgroups) as testenv.Config keeps them.

// startPerfDaemon starts a daemon whose max_sandboxes admits n live
// sandboxes (the default of 32 would refuse the density run).
func startPerfDaemon(b *testing.B, n int) (*testenv.Daemon, *client.Client) {
	d := testenv.NewDaemon(b)
	d.Config.Log.Level = "info" // a debug line per request would be measured too
	// testenv keeps the host's cgroup2 mount as it found it; the default
	// configuration sets favordynmods, which spares every create's first
	// cgroup move an RCU grace period (docs/ARCHITECTURE.md, "Where a
	// create's time goes"). Host-wide and never cleared: opt in.
	d.Config.Sandbox.CgroupFavorDynMods = os.Getenv("SANDBOXD_BENCH_FAVORDYNMODS") == "1"
	if n > d.Config.Sandbox.MaxSandboxes {
		d.Config.Sandbox.MaxSandboxes = n
	}
	if u := &d.Config.Sandbox.UsernsPool; u.Count > 0 && int64(n) > u.Count {
		// testenv gives each daemon one of 32 blocks of 64 ranges; past
		// them (above every test daemon's) there is room for thousands.
		u.Base = config.Default().Sandbox.UsernsPool.Base + 32*64*u.Size
		u.Count = int64(n) + 8
	}
	data, err := config.Marshal(d.Config)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		b.Fatal(err)
	}
	d.Start()
	c, err := client.New(client.Options{URL: "http://" + d.HTTPAddr, Token: d.Token()})
	if err != nil {
		b.Fatal(err)
	}
	return d, c
}

func medianMS(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}

// BenchmarkRESTLifecycle measures over REST (HTTP with a bearer token, as a
// remote client would) create→ready of a shell sandbox, exec of `true` in
// it and its terminate, reporting the medians in milliseconds — and, in the
// same run, the same three calls through an engine in this process
// (engine-*-ms, as pkg/engine's BenchmarkSandboxLifecycle makes them),
// alternating each iteration which of the two goes first. What REST adds is
// then the median of the per-iteration differences (rest-over-engine-*-ms):
// two benchmarks run minutes apart on a shared host differ by more than
// that from load alone (docs/ARCHITECTURE.md, "Where run_code's and the
// front ends' time goes").
func BenchmarkRESTLifecycle(b *testing.B) {
	_, c := startPerfDaemon(b, 0)
	e := startPerfEngine(b)
	ctx := context.Background()
	type lifecycle struct {
		create func() (string, error)
		exec   func(id string) error
		term   func(id string) error
	}
	rest := lifecycle{
		create: func() (string, error) {
			sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"})
			if err != nil {
				return "", err
			}
			return sb.ID, nil
		},
		exec: func(id string) error {
			res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}}, nil)
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", res.ExitCode)
			}
			return err
		},
		term: func(id string) error {
			_, err := c.TerminateSandbox(ctx, id)
			return err
		},
	}
	eng := lifecycle{
		create: func() (string, error) {
			sb, err := e.CreateSandbox(ctx, engine.CreateSandboxRequest{Language: "shell"})
			if err != nil {
				return "", err
			}
			return sb.ID, nil
		},
		exec: func(id string) error {
			res, err := e.Exec(ctx, engine.ExecRequest{SandboxID: id, Argv: []string{"true"}}, nil)
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", res.ExitCode)
			}
			return err
		},
		term: func(id string) error {
			_, err := e.TerminateSandbox(ctx, id)
			return err
		},
	}
	// phases runs one lifecycle, each call a region of Go's execution
	// tracer (-test.trace) to lay beside the daemon's api.request regions:
	// the client's and the wire's share of a call is the difference.
	phases := func(name string, l lifecycle) [3]time.Duration { // create, exec, terminate
		t0 := time.Now()
		reg := rtrace.StartRegion(ctx, name+".create")
		id, err := l.create()
		reg.End()
		if err != nil {
			b.Fatalf("%s create: %v", name, err)
		}
		t1 := time.Now()
		reg = rtrace.StartRegion(ctx, name+".exec")
		err = l.exec(id)
		reg.End()
		if err != nil {
			b.Fatalf("%s exec true: %v", name, err)
		}
		t2 := time.Now()
		reg = rtrace.StartRegion(ctx, name+".terminate")
		err = l.term(id)
		reg.End()
		if err != nil {
			b.Fatalf("%s terminate: %v", name, err)
		}
		return [3]time.Duration{t1.Sub(t0), t2.Sub(t1), time.Since(t2)}
	}
	// The first create of each pays for cold caches (image pages, the disk
	// pool's first fill): not part of the figures.
	phases("warm-rest", rest)
	phases("warm-inproc", eng)
	var r, en [3][]time.Duration // create, exec, terminate
	add := func(to *[3][]time.Duration, p [3]time.Duration) {
		for k := range p {
			to[k] = append(to[k], p[k])
		}
	}
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			add(&r, phases("rest", rest))
			add(&en, phases("inproc", eng))
		} else {
			add(&en, phases("inproc", eng))
			add(&r, phases("rest", rest))
		}
	}
	b.StopTimer()
	over := func(k int) float64 {
		d := make([]time.Duration, len(r[k]))
		for i := range d {
			d[i] = r[k][i] - en[k][i]
		}
		return medianMS(d)
	}
	b.ReportMetric(medianMS(r[0]), "rest-create-ms")
	b.ReportMetric(medianMS(r[1]), "rest-exec-ms")
	b.ReportMetric(medianMS(r[2]), "rest-terminate-ms")
	b.ReportMetric(medianMS(r[0])+medianMS(r[1])+medianMS(r[2]), "rest-lifecycle-ms")
	b.ReportMetric(medianMS(en[0]), "engine-create-ms")
	b.ReportMetric(medianMS(en[1]), "engine-exec-ms")
	b.ReportMetric(medianMS(en[2]), "engine-terminate-ms")
	b.ReportMetric(over(0), "rest-over-engine-create-ms")
	b.ReportMetric(over(1), "rest-over-engine-exec-ms")
	b.ReportMetric(over(2), "rest-over-engine-terminate-ms")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}

// startPerfEngine starts an engine in this process, configured as a perf
// daemon's (testenv's defaults, favordynmods only when asked), for the
// same-run engine side of BenchmarkRESTLifecycle; its cleanup terminates
// what is left, closes it and checks that nothing was left behind.
func startPerfEngine(b *testing.B) *engine.Engine {
	cfg := testenv.Config(b, "restb")
	cfg.Sandbox.CgroupFavorDynMods = os.Getenv("SANDBOXD_BENCH_FAVORDYNMODS") == "1"
	return engineenv.New(b, cfg)
}

// BenchmarkDensity creates SANDBOXD_BENCH_N (default 50) idle shell
// sandboxes from 8 concurrent REST clients, then terminates them from 8,
// and reports creates and terminates per second, host memory per idle
// sandbox (the fall of MemAvailable), and the daemon's RSS before, with
// the sandboxes live, and after they ended. b.N is ignored beyond 1: one
// density run is the measurement (use -benchtime 1x).
func BenchmarkDensity(b *testing.B) {
	n := 50
	if s := os.Getenv("SANDBOXD_BENCH_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("SANDBOXD_BENCH_N=%q: want a positive number of sandboxes", s)
		}
		n = v
	}
	const clients = 8
	d, c := startPerfDaemon(b, n)
	ctx := context.Background()
	// Warm: the first sandbox pays for cold caches.
	if sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"}); err != nil {
		b.Fatal(err)
	} else if _, err := c.TerminateSandbox(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
	rssStart := readKiB(b, fmt.Sprintf("/proc/%d/status", d.PID()), "VmRSS:")
	anonStart := readKiB(b, fmt.Sprintf("/proc/%d/smaps_rollup", d.PID()), "Anonymous:")
	goStart := goMetrics(b, d)
	memBefore := readKiB(b, "/proc/meminfo", "MemAvailable:")

	ids := make([]string, n)
	run := func(op func(i int) error) time.Duration {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
			next = make(chan int)
		)
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for i := range next {
					if err := op(i); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		if len(errs) > 0 {
			b.Fatalf("%d of %d failed, first: %v", len(errs), n, errs[0])
		}
		return time.Since(start)
	}
	b.ResetTimer()
	createWall := run(func(i int) error {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			return err
		}
		ids[i] = sb.ID
		return nil
	})
	// Idle: let the sandboxes' agents and the daemon settle before reading.
	waitSettled(b, d.PID())
	memLive := readKiB(b, "/proc/meminfo", "MemAvailable:")
	rssLive := readKiB(b, fmt.Sprintf("/proc/%d/status", d.PID()), "VmRSS:")
	threads := readKiB(b, fmt.Sprintf("/proc/%d/status", d.PID()), "Threads:")
	// Where the RSS per sandbox goes: anonymous memory (heap, stacks)
	// against the binary's pages, and of the Go runtime's share the
	// goroutines, their stacks and the live heap (after a collection the
	// daemon's own metrics do not force: heap_alloc counts garbage too).
	anonLive := readKiB(b, fmt.Sprintf("/proc/%d/smaps_rollup", d.PID()), "Anonymous:")
	goLive := goMetrics(b, d)
	// What the sandboxes' own cgroups are charged (their processes, page
	// cache and kernel memory of their tasks): a floor of the host memory
	// they cost that other tenants of the machine do not disturb, unlike
	// MemAvailable.
	cgUsage, err := cgroups.ReadUsage(d.Config.Sandbox.CgroupParent)
	if err != nil {
		b.Fatal(err)
	}
	termWall := run(func(i int) error {
		_, err := c.TerminateSandbox(ctx, ids[i])
		return err
	})
	b.StopTimer()
	waitSettled(b, d.PID())
	rssEnd := readKiB(b, fmt.Sprintf("/proc/%d/status", d.PID()), "VmRSS:")

	b.ReportMetric(float64(n), "sandboxes")
	b.ReportMetric(float64(n)/createWall.Seconds(), "creates/s")
	b.ReportMetric(float64(n)/termWall.Seconds(), "terminates/s")
	b.ReportMetric(float64(memBefore-memLive)/1024/float64(n), "MiB/sandbox")
	b.ReportMetric(float64(cgUsage.MemoryBytes)/(1<<20)/float64(n), "cgroup-MiB/sandbox")
	b.ReportMetric(float64(rssStart)/1024, "rss-start-MiB")
	b.ReportMetric(float64(rssLive)/1024, "rss-live-MiB")
	b.ReportMetric(float64(rssLive-rssStart)/float64(n), "rss-KiB/sandbox")
	b.ReportMetric(float64(rssEnd)/1024, "rss-end-MiB")
	b.ReportMetric(float64(threads), "daemon-threads")
	per := func(k string) float64 { return (goLive[k] - goStart[k]) / float64(n) }
	b.ReportMetric(float64(anonLive-anonStart)/float64(n), "anon-KiB/sandbox")
	b.ReportMetric(float64(anonStart)/1024, "anon-start-MiB")
	b.ReportMetric(goStart["go_memstats_heap_inuse_bytes"]/(1<<20), "heap-inuse-start-MiB")
	b.ReportMetric(per("go_goroutines"), "goroutines/sandbox")
	b.ReportMetric(per("go_memstats_stack_inuse_bytes")/1024, "stack-KiB/sandbox")
	b.ReportMetric(per("go_memstats_heap_alloc_bytes")/1024, "heap-alloc-KiB/sandbox")
	b.ReportMetric(per("go_memstats_heap_inuse_bytes")/1024, "heap-inuse-KiB/sandbox")
	b.ReportMetric(0, "ns/op") // the figures above are the result
}

// goMetrics reads the daemon's Go runtime gauges from its /metrics.
func goMetrics(b *testing.B, d *testenv.Daemon) map[string]float64 {
	req, err := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr+"/metrics", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("GET /metrics: %s", resp.Status)
	}
	want := []string{"go_goroutines", "go_memstats_stack_inuse_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_heap_inuse_bytes"}
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && slices.Contains(want, f[0]) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatalf("/metrics: %s: %v", sc.Text(), err)
			}
			got[f[0]] = v
		}
	}
	for _, k := range want {
		if _, ok := got[k]; !ok {
			b.Fatalf("/metrics has no %s", k)
		}
	}
	return got
}

// waitSettled waits (bounded) until the daemon's CPU time stops growing
// for 200 ms: the figures are of idle sandboxes, not of a daemon still
// finishing creates' background work.
func waitSettled(b *testing.B, pid int) {
	cpu := func() string {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatal(err)
		}
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
		return f[11] + "/" + f[12] // utime/stime
	}
	last := cpu()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond) // a sampling interval, not synchronisation
		now := cpu()
		if now == last {
			return
		}
		last = now
	}
}

// readKiB reads a "Key: value kB" (or "Key: count") line of a /proc file.
func readKiB(b *testing.B, path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			v, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
	}
	b.Fatalf("%s: no %s line", path, key)
	return 0
}
