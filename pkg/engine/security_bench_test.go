package engine

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestMeasureDiagnosticsOverhead prints the figures of docs/security.md §2
// ("Blocked-syscall diagnostics", the measured table):
// exec of true with and without blocked-syscall diagnostics (medians, the
// two alternating), and the cost of one refused syscall each way. Only with
// SANDBOXD_MEASURE=1: it asserts nothing worth a slot in make test.
func TestMeasureDiagnosticsOverhead(t *testing.T) {
	if os.Getenv("SANDBOXD_MEASURE") != "1" {
		t.Skip("set SANDBOXD_MEASURE=1")
	}
	requireRoot(t)
	on := newRunEngine(t, []string{"python"})
	off := newRunEngine(t, []string{"python"}, func(c *config.Config) { c.Sandbox.SeccompDiagnostics = false })
	ctx := context.Background()
	sbs := map[string]string{}
	for name, env := range map[string]*testEnv{"on": on, "off": off} {
		info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "python"})
		if err != nil {
			t.Fatal(err)
		}
		sbs[name] = info.ID
	}
	envs := map[string]*testEnv{"on": on, "off": off}
	times := map[string][]time.Duration{}
	for range 40 {
		for _, name := range []string{"on", "off"} {
			start := time.Now()
			if _, err := envs[name].Exec(ctx, ExecRequest{SandboxID: sbs[name], Argv: []string{"true"}}, nil); err != nil {
				t.Fatal(err)
			}
			times[name] = append(times[name], time.Since(start))
		}
	}
	for _, name := range []string{"on", "off"} {
		slices.Sort(times[name])
		t.Logf("exec true, diagnostics %s: median %v (n=%d)", name, times[name][len(times[name])/2], len(times[name]))
	}
	const n = 20000
	prog := "import ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\nt = time.perf_counter()\nfor _ in range(" + strconv.Itoa(n) + "):\n    libc.syscall(272, 0x10000000)\nprint((time.perf_counter() - t) / " + strconv.Itoa(n) + " * 1e6)\n"
	for _, name := range []string{"on", "off"} {
		res, err := envs[name].Exec(ctx, ExecRequest{SandboxID: sbs[name], Argv: []string{"python3", "-c", prog}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("refused unshare, diagnostics %s: %s µs per call (incl. Python's ctypes call); blocked %+v", name, strings.TrimSpace(res.Stdout), res.BlockedSyscalls)
	}
}
