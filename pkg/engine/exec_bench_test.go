package engine

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkExecSequence separates what BenchmarkSandboxLifecycle's exec
// figure mixes: an exec of `true` right after create (the agent has just
// started: its spare job helper may still be on its way), the next one at
// once (the spare taken by the first is being replaced), and one after the
// agent has been idle for 40 ms (everything prepared). Medians of each.
// Run with: go test -tags seccomp -run '^$' -bench ExecSequence -benchtime 20x ./pkg/engine
func BenchmarkExecSequence(b *testing.B) {
	requireRoot(b)
	env := newTestEngine(b, func(c *config.Config) {
		c.Sandbox.CgroupFavorDynMods = os.Getenv("SANDBOXD_BENCH_FAVORDYNMODS") == "1"
		// SANDBOXD_BENCH_LANDLOCK=off measures the same build without
		// the Landlock layer (its cost on create and exec).
		if m := os.Getenv("SANDBOXD_BENCH_LANDLOCK"); m != "" {
			c.Sandbox.Landlock = m
		}
	})
	ctx := context.Background()
	exec := func(id string) time.Duration {
		t0 := time.Now()
		res, err := env.Exec(ctx, ExecRequest{SandboxID: id, Argv: []string{"true"}}, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v %+v", err, res)
		}
		return time.Since(t0)
	}
	var first, next, idle []time.Duration
	for i := 0; i < b.N; i++ {
		info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
		if err != nil {
			b.Fatal(err)
		}
		first = append(first, exec(info.ID))
		next = append(next, exec(info.ID))
		time.Sleep(40 * time.Millisecond)
		idle = append(idle, exec(info.ID))
		if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(median(first)), "exec-first-ms")
	b.ReportMetric(ms(median(next)), "exec-next-ms")
	b.ReportMetric(ms(median(idle)), "exec-idle-ms")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}
