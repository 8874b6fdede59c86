package engine

import (
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"
)

// BenchmarkRunCodePython measures run_code of Python `print(1)` end to end
// (ephemeral sandbox created, file written, run, record written, sandbox
// terminated) against the baseline of `python3 -c 'print(1)'` chrooted into
// the same image without any isolation, both measured in this run. It
// reports medians in milliseconds and their ratio.
func BenchmarkRunCodePython(b *testing.B) {
	env := newRunEngine(b, []string{"python"})
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
	r, c := runMedian(runs), runMedian(base)
	b.ReportMetric(runMS(r), "run_code-ms")
	b.ReportMetric(runMS(c), "chroot-ms")
	b.ReportMetric(float64(r)/float64(c), "ratio")
	b.Logf("median run_code %.1f ms, chroot python3 %.1f ms, ratio %.1f (n=%d)", runMS(r), runMS(c), float64(r)/float64(c), b.N)
}

func runMedian(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func runMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
