package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
)

// instantFixer answers at once with the next version of a program that
// needs three fixes: version k exits 1 until version 3 prints "ok".
type instantFixer struct{ ns atomic.Int64 }

func (f *instantFixer) Name() string { return "instant" }

func (f *instantFixer) Fix(_ context.Context, req *autofix.FixRequest) (*autofix.Answer, error) {
	start := time.Now()
	defer func() { f.ns.Add(int64(time.Since(start))) }()
	return &autofix.Answer{Text: programVersion(req.Attempt)}, nil
}

func programVersion(k int) string {
	if k >= 3 {
		return "print('ok')\n"
	}
	return fmt.Sprintf("import sys\nsys.exit('version %d fails')\n", k)
}

// BenchmarkAutofixPython runs an autofix loop of three fix iterations (four
// attempts) of a Python script with an instant in-process provider (through
// the sampling slot, as an MCP client's model would be). It reports the
// median loop end to end (sandbox created and removed included), the
// median time per attempt with the provider's time excluded, the loop's
// own overhead per attempt (the steps' time in the sandbox excluded too)
// and, as the baseline measured in the same run, run_code of the same
// script into a live sandbox.
func BenchmarkAutofixPython(b *testing.B) {
	env := newRunEngine(b, []string{"python"})
	ctx := context.Background()
	sb, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "python"})
	if err != nil {
		b.Fatal(err)
	}
	var loops, perAttempt, overhead, base []time.Duration
	b.ResetTimer()
	for range b.N {
		fixer := &instantFixer{}
		start := time.Now()
		res, err := env.Autofix(ctx, AutofixRequest{Language: "python", Code: programVersion(0), Provider: apitypes.ProviderSampling},
			AutofixOptions{Sampling: fixer})
		el := time.Since(start)
		if err != nil || res.Status != apitypes.AutofixFixed || res.Attempts != 4 {
			b.Fatalf("%+v, %v", res, err)
		}
		loops = append(loops, el)
		// Per attempt: the loop's time between provider calls, spread over
		// the attempts (the sandbox's creation and removal are outside).
		loopTime := time.Duration(res.DurationMS)*time.Millisecond - time.Duration(fixer.ns.Load())
		perAttempt = append(perAttempt, loopTime/4)
		// What is left when the steps' own time in the sandbox (as the
		// agent measured it) is taken out too: writing files, records,
		// state, diffs.
		run, err := env.GetRun(ctx, res.RunID, 1)
		if err != nil {
			b.Fatal(err)
		}
		var steps time.Duration
		for _, st := range run.Metadata.Steps {
			steps += time.Duration(st.DurationMS) * time.Millisecond
		}
		overhead = append(overhead, (loopTime-steps)/4)
		start = time.Now()
		if _, err := env.RunCode(ctx, RunCodeRequest{Language: "python", Code: programVersion(0), SandboxID: sb.ID}, nil); err != nil {
			b.Fatal(err)
		}
		base = append(base, time.Since(start))
	}
	b.StopTimer()
	l, a, o, r := median(loops), median(perAttempt), median(overhead), median(base)
	b.ReportMetric(ms(l), "loop-3fixes-ms")
	b.ReportMetric(ms(a), "attempt-ms")
	b.ReportMetric(ms(o), "overhead-ms")
	b.ReportMetric(ms(r), "run_code-ms")
	b.ReportMetric(0, "ns/op")
}
