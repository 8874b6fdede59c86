package prometheus

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
)

// TestMetricNamesExported: every metric the alert rules and the dashboard
// read is one a real daemon exports. The daemon runs with a warm pool, the
// audit log on and a drain under way, and has created a sandbox and run a
// command in it, so that every family the rules and panels read has a
// sample; it is scraped on its /metrics like Prometheus would.
func TestMetricNamesExported(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t)
	d.Config.Sandbox.Pool = map[string]int{"shell": 1}
	d.Config.Audit.Enabled = true
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()

	id := strings.TrimSpace(d.MustCtl("create", "--lang", "shell"))
	d.MustCtl("exec", id, "--", "true")
	d.MustCtl("run", "--lang", "shell", writeFile(t, "main.sh", "echo hi\n"))

	families := func() map[string]model.MetricType {
		res, err := d.UnixGet("/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s", res.Status)
		}
		body, _ := io.ReadAll(res.Body)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		out := map[string]model.MetricType{}
		for name, f := range fams {
			if len(f.GetMetric()) > 0 {
				// dto's type names are upper case (HISTOGRAM); model's are
				// the exposition format's (histogram).
				out[name] = model.MetricType(strings.ToLower(f.GetType().String()))
			}
		}
		return out
	}
	drain(t, d, true)
	// The warm pool refills and the audit log verifies in the background.
	var exported map[string]model.MetricType
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a warm sandbox's start on a loaded host
	defer cancel()
	for {
		exported = families()
		_, warm := exported["sandboxd_pool_warm"]
		_, audited := exported["sandboxd_audit_chain_ok"]
		if warm && audited || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	drain(t, d, false)

	referenced := map[string][]string{} // name → where
	for _, r := range rules(t) {
		for _, n := range metricNames(r.Expr) {
			referenced[n] = append(referenced[n], "rules.yaml "+r.Alert+r.Record)
		}
	}
	dash := dashboard(t)
	for _, q := range dash.queries() {
		for _, n := range metricNames(q.Expr) {
			referenced[n] = append(referenced[n], "the dashboard: "+q.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if s, ok := v.Query.(map[string]any); ok {
			if q, _ := s["query"].(string); q != "" {
				for _, n := range metricNames(q) {
					referenced[n] = append(referenced[n], "the dashboard's variable "+v.Name)
				}
			}
		}
	}
	if len(referenced) < 15 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: %v", len(referenced), referenced)
	}
	names := make([]string, 0, len(referenced))
	for n := range referenced {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch {
		case n == "up":
			// Prometheus's own series of each scrape.
		case n == gateway.NodeUpMetric:
			// The gateway's, beside its nodes' (pkg/gateway).
		case exported[n] != "":
		case histogramSeries(n, exported):
		default:
			t.Errorf("%s is not exported by the daemon; read by %v", n, referenced[n])
		}
	}
	t.Logf("%d metric names checked against %d families exported", len(names), len(exported))
}

// histogramSeries reports whether n is the _bucket, _sum or _count series of
// an exported histogram.
func histogramSeries(n string, exported map[string]model.MetricType) bool {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(n, suffix); ok && exported[base] == model.MetricTypeHistogram {
			return true
		}
	}
	return false
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	grafanaVars    = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	labelValues    = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*\w+\s*\)`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlNumber   = regexp.MustCompile(`\b[0-9][0-9.eE+-]*[a-z]*\b`)
)

// promqlKeywords are the identifiers of PromQL that are not metric names
// when not followed by "(" (functions are told by their parenthesis).
var promqlKeywords = []string{"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}

// metricNames are the metric names an expression (PromQL, or Grafana's
// label_values) reads: its identifiers once strings, label matchers,
// ranges, grouping clauses, Grafana's variables, numbers, functions and
// keywords are taken out.
func metricNames(expr string) []string {
	expr = labelValues.ReplaceAllString(expr, "$1")
	expr = grafanaVars.ReplaceAllString(expr, " ")
	expr = promqlStrings.ReplaceAllString(expr, " ")
	expr = promqlMatchers.ReplaceAllString(expr, " ")
	expr = promqlRanges.ReplaceAllString(expr, " ")
	expr = promqlGrouping.ReplaceAllString(expr, " ")
	expr = promqlNumber.ReplaceAllString(expr, " ")
	var out []string
	for _, m := range promqlIdent.FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") || slices.Contains(promqlKeywords, strings.ToLower(m)) {
			continue
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// TestMetricNames: the extraction the drift test relies on.
func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (instance) (rate(sandboxd_sandboxes_created_total{outcome="failed"}[10m])) / sum by (instance) (rate(sandboxd_sandboxes_created_total[10m])) > 0.1`: {"sandboxd_sandboxes_created_total"},
		`histogram_quantile(0.99, sum by (le) (rate(sandboxd_exec_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`:                                       {"sandboxd_exec_seconds_bucket"},
		`sandboxd_pool_size > 0 and sandboxd_pool_warm == 0`:                        {"sandboxd_pool_size", "sandboxd_pool_warm"},
		`time() - sandboxd_node_draining_since_timestamp_seconds > 4 * 3600`:        {"sandboxd_node_draining_since_timestamp_seconds"},
		`up{job="mcp-sandboxd"} == 0`:                                               {"up"},
		`label_values(sandboxd_sandboxes, instance)`:                                {"sandboxd_sandboxes"},
		`a / on(instance) group_left(dir) b{x="}"} offset 5m`:                       {"a", "b"},
		`increase(sandboxd_audit_append_failures_total[10m]) > 1e3 unless node_x_y`: {"sandboxd_audit_append_failures_total", "node_x_y"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// drain starts or ends the daemon's drain (PUT /v1/node/drain on its unix
// socket).
func drain(t *testing.T, d *testenv.Daemon, draining bool) {
	t.Helper()
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.Socket)
		},
	}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPut, "http://daemon/v1/node/drain", strings.NewReader(fmt.Sprintf(`{"draining":%v}`, draining)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("PUT /v1/node/drain %v: %s %s", draining, res.Status, body)
	}
}
