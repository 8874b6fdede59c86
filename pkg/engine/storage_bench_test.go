package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

// BenchmarkDiskBacking compares, alternately in one run, the two backings
// of a sandbox's writable file system at the defaults (512M memory, 1G
// disk): create→ready and terminate of a shell sandbox, and run_code of Python
// `print(1)` (ephemeral sandbox, created and terminated), reporting medians
// in milliseconds and the difference disk − memory of the create medians.
// Run with: go test -tags seccomp -run '^$' -bench DiskBacking -benchtime 20x ./pkg/engine
func BenchmarkDiskBacking(b *testing.B) {
	env := newRunEngine(b, []string{"python"}, func(c *config.Config) {
		c.Sandbox.Memory = 512 << 20
		c.Sandbox.Disk = 1 << 30
	})
	ctx := context.Background()
	backings := []string{storage.BackingDisk, storage.BackingMemory}
	create := map[string][]time.Duration{}
	terminate := map[string][]time.Duration{}
	run := map[string][]time.Duration{}
	// The first disk create formats the template: not part of the figures.
	warm, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", DiskBacking: storage.BackingDisk})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.TerminateSandbox(ctx, warm.ID); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		for _, backing := range backings {
			t0 := time.Now()
			info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", DiskBacking: backing})
			if err != nil {
				b.Fatal(err)
			}
			create[backing] = append(create[backing], time.Since(t0))
			t0 = time.Now()
			if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
				b.Fatal(err)
			}
			terminate[backing] = append(terminate[backing], time.Since(t0))
			// run_code takes the configured default backing; nothing else
			// reads this key while the benchmark runs.
			env.cfg.Sandbox.DiskBacking = backing
			t0 = time.Now()
			res, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: "print(1)"}, nil)
			if err != nil || res.Stdout != "1\n" {
				b.Fatalf("run_code: %v %+v", err, res)
			}
			run[backing] = append(run[backing], time.Since(t0))
		}
	}
	b.StopTimer()
	for _, backing := range backings {
		b.ReportMetric(ms(median(create[backing])), "create-"+backing+"-ms")
		b.ReportMetric(ms(median(terminate[backing])), "terminate-"+backing+"-ms")
		b.ReportMetric(ms(median(run[backing])), "run_code-"+backing+"-ms")
	}
	b.ReportMetric(ms(median(create[storage.BackingDisk])-median(create[storage.BackingMemory])), "create-disk-minus-memory-ms")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}
