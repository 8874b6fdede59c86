package engine

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// metrics are the engine's Prometheus instruments, on a registry of its own
// (no global state, so tests can run several engines in one process).
type metrics struct {
	registry     *prometheus.Registry
	createTime   prometheus.Histogram
	execTime     prometheus.Histogram
	created      *prometheus.CounterVec
	terminations *prometheus.CounterVec
	causes       *prometheus.CounterVec
	runs         *prometheus.CounterVec
	imageBuilds  *prometheus.CounterVec
}

// latencyBuckets span a warm exec (~1 ms) to a slow image-backed create (~30 s).
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(e *Engine) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		createTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "sandboxd", Name: "sandbox_create_seconds",
			Help: "Time from a create request to a ready sandbox.", Buckets: latencyBuckets,
		}),
		execTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "sandboxd", Name: "exec_seconds",
			Help: "Duration of commands run to completion through exec.", Buckets: latencyBuckets,
		}),
		created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandboxd", Name: "sandboxes_created_total",
			Help: "Sandbox creations by outcome (ready, failed, rejected).",
		}, []string{"outcome"}),
		terminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandboxd", Name: "sandbox_transitions_total",
			Help: "Sandbox state transitions by target state.",
		}, []string{"to"}),
		causes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandboxd", Name: "command_terminations_total",
			Help: "Finished commands by termination cause.",
		}, []string{"cause"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandboxd", Name: "runs_total",
			Help: "run_code calls by language and outcome (success, failure: a step failed, error: no result).",
		}, []string{"language", "outcome"}),
		imageBuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandboxd", Name: "image_builds_total",
			Help: "Image builds the daemon started on first use of an image, by image and outcome (built, failed).",
		}, []string{"image", "outcome"}),
	}
	m.registry.MustRegister(
		m.createTime, m.execTime, m.created, m.terminations, m.causes, m.runs, m.imageBuilds,
		&stateCollector{e: e, desc: prometheus.NewDesc("sandboxd_sandboxes", "Sandboxes by state.", []string{"state"}, nil)},
		&networkCollector{e: e, desc: prometheus.NewDesc("sandboxd_sandbox_connection_attempts_total",
			"Connection attempts of each sandbox with network, by verdict of its network policy (allowed, denied).",
			[]string{"sandbox_id", "verdict"}, nil)},
		newTenantCollector(e),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// stateCollector counts sandboxes by state from the store at scrape time, so
// the gauge can never drift from the truth.
type stateCollector struct {
	e    *Engine
	desc *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range []sandbox.State{sandbox.StateCreating, sandbox.StateReady, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateTerminated, sandbox.StateFailed} {
		n, err := c.e.store.CountSandboxes(ctx, string(s))
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(s))
	}
}

// MetricsRegistry is the registry /metrics serves.
func (e *Engine) MetricsRegistry() *prometheus.Registry { return e.metrics.registry }

// networkCollector reads each connected sandbox's nftables counters at
// scrape time. The label set is bounded by sandbox.max_sandboxes.
type networkCollector struct {
	e    *Engine
	desc *prometheus.Desc
}

func (c *networkCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *networkCollector) Collect(ch chan<- prometheus.Metric) {
	if c.e.net == nil {
		return
	}
	for _, id := range c.e.net.Connected() {
		st, err := c.e.net.Status(id)
		if err != nil {
			continue // terminated between the list and the read
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(st.Counters.Allowed), id, "allowed")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(st.Counters.Denied), id, "denied")
	}
}
