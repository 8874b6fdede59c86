package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkCreateUserns compares, alternately in one run, create→ready and
// terminate of a shell sandbox in its own user namespace (the default
// sandbox.userns_pool) and without one (count 0), through two engines with
// the same configuration otherwise, reporting medians in milliseconds.
// Run with: go test -tags seccomp -run '^$' -bench CreateUserns -benchtime 20x ./pkg/engine
func BenchmarkCreateUserns(b *testing.B) {
	modes := []string{"userns", "none"}
	envs := map[string]*testEnv{
		"userns": newTestEngine(b),
		"none":   newTestEngine(b, func(c *config.Config) { c.Sandbox.UsernsPool.Count = 0 }),
	}
	ctx := context.Background()
	create := map[string][]time.Duration{}
	terminate := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, m := range modes {
			t0 := time.Now()
			info, err := envs[m].CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
			if err != nil {
				b.Fatal(err)
			}
			create[m] = append(create[m], time.Since(t0))
			t0 = time.Now()
			if _, err := envs[m].TerminateSandbox(ctx, info.ID); err != nil {
				b.Fatal(err)
			}
			terminate[m] = append(terminate[m], time.Since(t0))
		}
	}
	b.StopTimer()
	for _, m := range modes {
		b.ReportMetric(ms(median(create[m])), "create-"+m+"-ms")
		b.ReportMetric(ms(median(terminate[m])), "terminate-"+m+"-ms")
	}
	b.ReportMetric(ms(median(create["userns"])-median(create["none"])), "create-userns-minus-none-ms")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}
