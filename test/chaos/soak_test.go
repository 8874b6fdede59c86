//go:build soak

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

const soakClients = 4

// Leak bounds, per 1,000 cycles of the fitted line, each together with a
// least growth over the measured window (below it, the slope of a short
// run is noise):
//
//   - Descriptors and goroutines are sampled with no request in flight, so
//     in a steady state they do not move at all: any slope is a leak, and
//     the bounds only leave room for pools that open lazily (SQLite's
//     readers, idle HTTP connections).
//   - RSS: the smallest thing a daemon could keep per sandbox by mistake —
//     a goroutine (an 8 KiB stack at least), a sandbox's record with its
//     spec and ledger (kilobytes), an event subscription — is 4 KiB or
//     more, so a leak shows as at least 4 MiB per 1,000 cycles; a steady
//     Go heap moves by its GC goal (a few MiB here), which over 1,000
//     cycles and more adds less than that to a fitted slope. A short run
//     must also grow by more than that noise (8 MiB) to fail.
var soakBounds = []struct {
	name   string
	slope  float64 // per 1,000 cycles
	growth float64 // over the measured window
}{
	{"fds", 1, 4},
	{"goroutines", 2, 10},
	{"rss_kib", 4 << 10, 8 << 10},
}

type soakSample struct {
	Cycles     int `json:"cycles"`
	RSSKiB     int `json:"rss_kib"`
	FDs        int `json:"fds"`
	Goroutines int `json:"goroutines"`
	// HeapKiB is the Go heap in use (go_memstats_heap_inuse_bytes): what
	// of the RSS is the daemon's own live and not yet collected data.
	HeapKiB int `json:"heap_inuse_kib"`
	// FDKinds counts the descriptors by what they are (socket, pipe, a
	// path's directory), to tell what leaks.
	FDKinds map[string]int `json:"fd_kinds,omitempty"`
}

type soakReport struct {
	Cycles      int                `json:"cycles"`
	Clients     int                `json:"clients"`
	Errors      int                `json:"errors"`
	WarmUp      int                `json:"warm_up_cycles"`
	Slopes      map[string]float64 `json:"slopes_per_1000_cycles"`
	Growth      map[string]float64 `json:"growth_over_window"`
	Samples     []soakSample       `json:"samples"`
	CyclesPerS  float64            `json:"cycles_per_second"`
	Leftovers   []string           `json:"leftovers"`
	Duration    string             `json:"duration"`
	LeakVerdict string             `json:"verdict"`
}

// TestSoak runs SOAK_CYCLES (default 10,000) create/exec/terminate cycles
// with four clients against one daemon, samples its RSS, open descriptors
// and goroutines between batches (no request in flight), fits a line from
// the end of the warm-up (a tenth of the cycles) and fails on a leak (see
// soakBounds); at the end nothing may be left. SOAK_REPORT names a file
// for the figures as JSON.
func TestSoak(t *testing.T) {
	testenv.RequireRoot(t)
	cycles := 10000
	if s := os.Getenv("SOAK_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 40 {
			t.Fatalf("SOAK_CYCLES=%q: want a count of at least 40", s)
		}
		cycles = n
	}
	r := newRig(t, 0)
	if _, err := r.start(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	pid := r.d.PID()
	c := r.client()
	defer c.Close()
	rep := soakReport{Cycles: cycles, Clients: soakClients, WarmUp: max(20, cycles/10), Slopes: map[string]float64{}, Growth: map[string]float64{}}
	began := time.Now()
	defer func() {
		rep.Duration = time.Since(began).Round(time.Second).String()
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Logf("soak figures:\n%s", b)
		if p := os.Getenv("SOAK_REPORT"); p != "" {
			if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
				t.Errorf("write %s: %v", p, err)
			}
		}
	}()

	batch := max(10, cycles/50)
	var mu sync.Mutex
	cycle := func(n int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		tok := fmt.Sprintf("soak-%d", n)
		res, err := c.Exec(ctx, s.ID, client.ExecRequest{Command: "echo " + tok}, nil)
		if err == nil && (res.ExitCode != 0 || res.Stdout != tok+"\n") {
			err = fmt.Errorf("answered exit %d stdout %q", res.ExitCode, res.Stdout)
		}
		if err != nil {
			err = fmt.Errorf("exec in %s: %w", s.ID, err)
		}
		if tr, terr := c.TerminateSandbox(ctx, s.ID); terr != nil {
			return fmt.Errorf("terminate %s: %w", s.ID, terr)
		} else if tr.State != apitypes.StateTerminated {
			return fmt.Errorf("terminate %s answered state %s", s.ID, tr.State)
		}
		return err
	}
	for done := 0; done < cycles; {
		n := min(batch, cycles-done)
		next := make(chan int, n)
		for i := range n {
			next <- done + i
		}
		close(next)
		var wg sync.WaitGroup
		for range soakClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := cycle(i); err != nil {
						mu.Lock()
						rep.Errors++
						if rep.Errors <= 20 {
							t.Errorf("cycle %d: %v", i, err)
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		done += n
		if rep.Errors > 100 {
			t.Fatalf("%d cycles failed; stopping", rep.Errors)
		}
		// No request in flight now: what the daemon holds is its steady state.
		rep.Samples = append(rep.Samples, sampleDaemon(t, r, pid, done))
	}
	rep.CyclesPerS = float64(cycles) / time.Since(began).Seconds()

	var xs []float64
	series := map[string][]float64{}
	for _, s := range rep.Samples {
		if s.Cycles < rep.WarmUp {
			continue
		}
		xs = append(xs, float64(s.Cycles))
		series["fds"] = append(series["fds"], float64(s.FDs))
		series["goroutines"] = append(series["goroutines"], float64(s.Goroutines))
		series["rss_kib"] = append(series["rss_kib"], float64(s.RSSKiB))
		series["heap_inuse_kib"] = append(series["heap_inuse_kib"], float64(s.HeapKiB))
	}
	if len(xs) < 3 {
		t.Fatalf("%d samples after the warm-up: too few to fit a line", len(xs))
	}
	window := xs[len(xs)-1] - xs[0]
	rep.LeakVerdict = "flat"
	// The heap's slope is reported beside the RSS's, to tell the daemon's
	// own data from the runtime's and SQLite's caches; the bound is on RSS.
	rep.Slopes["heap_inuse_kib"] = fitSlope(xs, series["heap_inuse_kib"]) * 1000
	rep.Growth["heap_inuse_kib"] = rep.Slopes["heap_inuse_kib"] * window / 1000
	for _, b := range soakBounds {
		slope := fitSlope(xs, series[b.name]) * 1000
		rep.Slopes[b.name] = slope
		rep.Growth[b.name] = slope * window / 1000
		if slope > b.slope && slope*window/1000 > b.growth {
			rep.LeakVerdict = "leak"
			t.Errorf("%s grow by %.2f per 1,000 cycles (%.1f over %v cycles): a leak (bound %.2f per 1,000, %.0f over the run)",
				b.name, slope, slope*window/1000, window, b.slope, b.growth)
		}
	}

	if rep.LeakVerdict == "leak" {
		// What the daemon's sockets are connected to, to tell what leaks
		// (ss in the simulated host, where the daemon's network side is).
		out, err := exec.Command("nsenter", "--net=/run/netns/"+r.tp.Host, "ss", "-apn", "-A", "all").CombinedOutput()
		var mine []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, fmt.Sprintf("pid=%d,", pid)) {
				mine = append(mine, l)
			}
		}
		t.Logf("the daemon's sockets (%v):\n%s", err, strings.Join(mine, "\n"))
		if lsof, err := exec.Command("lsof", "-n", "-p", strconv.Itoa(pid)).CombinedOutput(); err == nil {
			t.Logf("lsof:\n%s", lsof)
		}
	}
	if live, err := c.ListSandboxes(context.Background(), ""); err != nil || len(live) != 0 {
		t.Errorf("live sandboxes after the soak: %v %v", live, err)
	}
	if _, err := c.GC(context.Background()); err != nil {
		t.Errorf("gc: %v", err)
	}
	rep.Leftovers = r.finalLeftovers()
	if rep.Leftovers == nil {
		rep.Leftovers = []string{}
	}
}

// sampleDaemon reads the daemon's RSS and open descriptors from /proc and
// its goroutines from /metrics.
func sampleDaemon(t *testing.T, r *rig, pid, cycles int) soakSample {
	s := soakSample{Cycles: cycles}
	if f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				s.RSSKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			}
		}
		f.Close()
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.FDs = len(fds)
		s.FDKinds = map[string]int{}
		for _, fd := range fds {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if i := strings.IndexAny(l, ":["); i > 0 && !strings.HasPrefix(l, "/") {
				l = l[:i]
			} else {
				l = filepath.Dir(l)
			}
			s.FDKinds[l]++
		}
	} else {
		t.Errorf("daemon descriptors: %v", err)
	}
	// The least of three reads: short-lived goroutines (timers, a
	// connection being closed) come and go between batches.
	for i := range 3 {
		res, err := r.d.UnixGet("/metrics")
		if err != nil {
			t.Errorf("/metrics: %v", err)
			return s
		}
		body, _ := io.ReadAll(res.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok && i == 0 {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				s.HeapKiB = int(f / 1024)
			}
			if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if i == 0 || int(f) < s.Goroutines {
					s.Goroutines = int(f)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.RSSKiB == 0 || s.Goroutines == 0 {
		t.Errorf("sample at %d cycles incomplete: %+v", cycles, s)
	}
	return s
}

// fitSlope is the least-squares slope of ys over xs.
func fitSlope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
