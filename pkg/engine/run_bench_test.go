package engine

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkRunCodePython measures run_code of Python `print(1)` end to end
// (ephemeral sandbox created, file written, run, record written, sandbox
// terminated) against the baseline of `python3 -c 'print(1)'` chrooted into
// the same image without any isolation, both measured in this run. It
// reports medians in milliseconds and their ratio.
func BenchmarkRunCodePython(b *testing.B) {
	benchRunCode(b, newRunEngine(b, []string{"python"}))
}

// BenchmarkRunCodePythonWarmPool is the same with sandbox.pool.python: 2, so
// that each run takes a ready sandbox instead of starting one.
func BenchmarkRunCodePythonWarmPool(b *testing.B) {
	env := newRunEngine(b, []string{"python"}, func(c *config.Config) { c.Sandbox.Pool = map[string]int{"python": 2} })
	time.Sleep(2 * time.Second) // let the pool fill before the first run
	benchRunCode(b, env)
}

func benchRunCode(b *testing.B, env *testEnv) {
	img := ensureImages(b, "python")["python"]
	ctx := context.Background()
	runs := make([]time.Duration, 0, b.N)
	base := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: "print(1)"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		runs = append(runs, time.Since(start))
		if res.Stdout != "1\n" {
			b.Fatalf("stdout %q", res.Stdout)
		}
		start = time.Now()
		out, err := exec.Command("chroot", img.Rootfs, "/usr/bin/python3", "-c", "print(1)").Output()
		if err != nil || string(out) != "1\n" {
			b.Fatalf("chroot baseline: %v %q", err, out)
		}
		base = append(base, time.Since(start))
	}
	b.StopTimer()
	r, c := median(runs), median(base)
	b.ReportMetric(ms(r), "run_code-ms")
	b.ReportMetric(ms(c), "chroot-ms")
	b.ReportMetric(float64(r)/float64(c), "ratio")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}
