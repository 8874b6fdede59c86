package engine

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkRunCodePython measures run_code of Python `print(1)` end to end
// as its caller waits for it (ephemeral sandbox created, file written, run,
// record written; the sandbox is terminated after the answer) against the baseline of `python3 -c 'print(1)'` chrooted into
// the same image without any isolation, both measured in this run. It
// reports medians in milliseconds and their ratio.
func BenchmarkRunCodePython(b *testing.B) {
	benchRunCode(b, newRunEngine(b, []string{"python"}))
}

// BenchmarkRunCodePythonWarmPool is the same with sandbox.pool.python: 2, so
// that each run takes a ready sandbox instead of starting one.
func BenchmarkRunCodePythonWarmPool(b *testing.B) {
	env := newRunEngine(b, []string{"python"}, func(c *config.Config) { c.Sandbox.Pool = map[string]int{"python": 2} })
	benchRunCode(b, env)
}

// settle waits, untimed, until the engine is at rest: no ephemeral sandbox
// still being terminated after its run answered, and the warm pool (if
// any) full again. Each run and each chroot baseline starts from there, as
// a caller's run does on a daemon that is not busy: what a run leaves to
// do after its answer (the terminate, the pool's refill) is work nobody
// waits for, and timed in a tight loop it would land on whichever
// measurement comes next — the chroot baseline included.
func settle(b *testing.B, env *testEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env.pipeline.WaitReleases(ctx)
	want := env.cfg.Sandbox.Pool["python"]
	for len(env.sandboxes.WarmIDs("python")) < want {
		select {
		case <-ctx.Done():
			b.Fatalf("the warm pool did not refill to %d within a minute", want)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func benchRunCode(b *testing.B, env *testEnv) {
	img := ensureImages(b, "python")["python"]
	ctx := context.Background()
	runs := make([]time.Duration, 0, b.N)
	base := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		settle(b, env)
		b.StartTimer()
		start := time.Now()
		res, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: "print(1)"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		runs = append(runs, time.Since(start))
		if res.Stdout != "1\n" {
			b.Fatalf("stdout %q", res.Stdout)
		}
		b.StopTimer()
		settle(b, env)
		b.StartTimer()
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
