package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// flushTimeout bounds the export of the last spans at shutdown: a
// collector that is down must not hold the daemon's stop.
const flushTimeout = 5 * time.Second

// startTelemetry starts exporting traces when telemetry.otlp_endpoint is
// set; the returned stop flushes the spans not yet sent (call it after the
// servers have drained, so that their last requests' spans are in).
func startTelemetry(ctx context.Context, c config.Telemetry, log *slog.Logger) (stop func(), err error) {
	p, err := telemetry.Setup(ctx, telemetry.Options{
		Endpoint: c.OTLPEndpoint, Protocol: c.OTLPProtocol, Headers: c.OTLPHeaders,
		SampleRatio: c.SampleRatio, ServiceName: c.ServiceName,
	})
	if err != nil {
		return nil, err
	}
	if p == nil {
		return func() {}, nil
	}
	// The agent client shares its package with the agent binary, which
	// must not link the exporter: its spans come through this hook.
	agent.SetTracer(telemetry.AgentSpan)
	// The endpoint is logged, the headers (credentials) never.
	log.Info("exporting traces", "otlp_endpoint", c.OTLPEndpoint, "protocol", c.OTLPProtocol, "sample_ratio", c.SampleRatio)
	return func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
		defer cancel()
		agent.SetTracer(nil)
		if err := p.Shutdown(fctx); err != nil {
			log.Warn("traces: flush at shutdown", "err", err)
		}
	}, nil
}
