package engine

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

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
	// Every outcome exists from the start, at 0: a rate over a series
	// that appears at its first failure misses that failure, and alerts
	// (deploy/prometheus) are written over these.
	for _, outcome := range []string{"ready", "failed", "rejected"} {
		m.created.WithLabelValues(outcome)
	}
	m.registry.MustRegister(
		m.createTime, m.execTime, m.created, m.terminations, m.causes, m.runs, m.imageBuilds,
		&stateCollector{e: e, desc: prometheus.NewDesc("sandboxd_sandboxes", "Sandboxes by state.", []string{"state"}, nil)},
		&networkCollector{e: e, desc: prometheus.NewDesc("sandboxd_sandbox_connection_attempts_total",
			"Connection attempts of each sandbox with network, by verdict of its network policy (allowed, denied).",
			[]string{"sandbox_id", "verdict"}, nil)},
		newTenantCollector(e),
		newNodeCollector(e),
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

// nodeCollector exports, read at scrape time, what an operator alerts on
// beside the sandboxes: the warm pools, the free space of the daemon's
// directories, the audit chain's last verification and the node's drain.
type nodeCollector struct {
	e                                   *Engine
	poolSize, poolWarm                  *prometheus.Desc
	fsAvail, fsSize                     *prometheus.Desc
	auditOK, auditVerified, auditFailed *prometheus.Desc
	draining, drainingSince             *prometheus.Desc
}

func newNodeCollector(e *Engine) *nodeCollector {
	return &nodeCollector{e: e,
		poolSize: prometheus.NewDesc("sandboxd_pool_size", "Warm sandboxes each warm pool keeps (sandbox.pool, templates' pools).", []string{"pool"}, nil),
		poolWarm: prometheus.NewDesc("sandboxd_pool_warm", "Warm sandboxes of each pool ready and unclaimed now.", []string{"pool"}, nil),
		fsAvail: prometheus.NewDesc("sandboxd_filesystem_avail_bytes",
			"Bytes free to the daemon on the filesystem of each of its directories (state: paths.state_dir, images, sandboxes: disk-backed sandboxes' files).", []string{"dir"}, nil),
		fsSize: prometheus.NewDesc("sandboxd_filesystem_size_bytes", "Size of the filesystem of each of the daemon's directories.", []string{"dir"}, nil),
		auditOK: prometheus.NewDesc("sandboxd_audit_chain_ok",
			"1 if the audit log's last verification (at start, every audit.verify_interval, on request) found every record intact, 0 if not; absent before the first or with audit off.", nil, nil),
		auditVerified: prometheus.NewDesc("sandboxd_audit_last_verification_timestamp_seconds", "When the audit log was last verified.", nil, nil),
		auditFailed:   prometheus.NewDesc("sandboxd_audit_append_failures_total", "Audit records that could not be written (the calls they recorded failed).", nil, nil),
		draining:      prometheus.NewDesc("sandboxd_node_draining", "1 while the node is draining (it takes no creates), else 0.", nil, nil),
		drainingSince: prometheus.NewDesc("sandboxd_node_draining_since_timestamp_seconds", "When the current drain began (kept across restarts); absent when not draining.", nil, nil),
	}
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.poolSize, c.poolWarm, c.fsAvail, c.fsSize, c.auditOK, c.auditVerified, c.auditFailed, c.draining, c.drainingSince} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	if e.sandboxes != nil {
		for key, p := range e.sandboxes.WarmPools() {
			ch <- prometheus.MustNewConstMetric(c.poolSize, prometheus.GaugeValue, float64(p.Size), key)
			ch <- prometheus.MustNewConstMetric(c.poolWarm, prometheus.GaugeValue, float64(p.Warm), key)
		}
	}
	for _, d := range []struct{ name, path string }{
		{"state", e.cfg.Paths.StateDir}, {"images", e.imagesDir()}, {"sandboxes", e.cfg.Paths.SandboxesDirOrDefault()},
	} {
		var st unix.Statfs_t
		if err := unix.Statfs(d.path, &st); err != nil {
			ch <- prometheus.NewInvalidMetric(c.fsAvail, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.fsAvail, prometheus.GaugeValue, float64(st.Bavail)*float64(st.Bsize), d.name)
		ch <- prometheus.MustNewConstMetric(c.fsSize, prometheus.GaugeValue, float64(st.Blocks)*float64(st.Bsize), d.name)
	}
	if e.audit != nil {
		ch <- prometheus.MustNewConstMetric(c.auditFailed, prometheus.CounterValue, float64(e.audit.Failures()))
		if v, ok := e.audit.LastVerification(); ok {
			chainOK := 0.0
			if v.OK {
				chainOK = 1
			}
			ch <- prometheus.MustNewConstMetric(c.auditOK, prometheus.GaugeValue, chainOK)
			ch <- prometheus.MustNewConstMetric(c.auditVerified, prometheus.GaugeValue, float64(v.At.UnixNano())/1e9)
		}
	}
	draining := 0.0
	if e.draining.Load() {
		draining = 1
		// The flag's file was written when the drain began (writeDrain
		// leaves it alone while it lasts): its time survives restarts,
		// so an alert on a long drain does not start over with each.
		if fi, err := os.Stat(filepath.Join(e.cfg.Paths.StateDir, drainFile)); err == nil {
			ch <- prometheus.MustNewConstMetric(c.drainingSince, prometheus.GaugeValue, float64(fi.ModTime().UnixNano())/1e9)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.draining, prometheus.GaugeValue, draining)
}
