package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/otlptest"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// BenchmarkExecTracing measures what tracing adds to an exec: two daemons
// side by side, one with telemetry off and one exporting every span
// (sample_ratio 1) over OTLP/HTTP to a real receiver (the collector's
// otlpreceiver, in this process), each with a ready shell sandbox; each
// iteration execs `true` over REST in both, alternating which goes first.
// It reports both medians and their difference (target: at most 0.2 ms,
// issue 27), and checks that the spans arrived.
func BenchmarkExecTracing(b *testing.B) {
	testenv.RequireRoot(b)
	rcv := otlptest.Start(b)
	start := func(endpoint string) (*testenv.Daemon, *client.Client, string) {
		d := testenv.NewDaemon(b)
		d.Config.Log.Level = "info" // a debug line per request would be measured too
		d.Config.Sandbox.CgroupFavorDynMods = os.Getenv("SANDBOXD_BENCH_FAVORDYNMODS") == "1"
		d.Config.Telemetry = config.Default().Telemetry
		d.Config.Telemetry.OTLPEndpoint = endpoint
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
		sb, err := c.CreateSandbox(context.Background(), client.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			b.Fatal(err)
		}
		return d, c, sb.ID
	}
	_, offC, offID := start("")
	onD, onC, onID := start(rcv.Endpoint)
	ctx := context.Background()
	exec := func(c *client.Client, id string) time.Duration {
		t0 := time.Now()
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}}, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v %+v", err, res)
		}
		return time.Since(t0)
	}
	for range 5 { // warm both: connections, page cache, the exporter's first batch
		exec(offC, offID)
		exec(onC, onID)
	}
	rcv.Reset()
	var off, on []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			off = append(off, exec(offC, offID))
			on = append(on, exec(onC, onID))
		} else {
			on = append(on, exec(onC, onID))
			off = append(off, exec(offC, offID))
		}
	}
	b.StopTimer()
	// The spans must have been made and exported, or "on" measured nothing.
	if err := onD.Stop(); err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, s := range rcv.Spans() {
		if s.Name == "sandbox.exec" {
			n++
		}
	}
	if n < b.N {
		b.Fatalf("the receiver got %d sandbox.exec spans for %d execs", n, b.N)
	}
	b.ReportMetric(medianMS(off), "exec-off-ms")
	b.ReportMetric(medianMS(on), "exec-on-ms")
	b.ReportMetric(medianMS(on)-medianMS(off), "tracing-ms")
	b.ReportMetric(0, "ns/op") // the medians above are the result
}
