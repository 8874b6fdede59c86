package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// NodeUpMetric is the gauge the gateway adds to its /metrics: 1 for each
// node that answered its scrape, 0 for the others.
const NodeUpMetric = "sandboxd_gateway_node_up"

// maxMetricsBytes caps one node's /metrics answer.
const maxMetricsBytes = 32 << 20

// metrics is GET /metrics on a gateway (admin only): every node's metrics
// with a node label, plus sandboxd_gateway_node_up per node, so that one
// scrape of the fleet's address sees all of it.
func (g *Gateway) metrics(w http.ResponseWriter, r *http.Request) {
	nodes, err := g.opt.Discovery.Nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.Unavailablef("node discovery: %v", err))
		return
	}
	fams := make([]map[string]*dto.MetricFamily, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fams[i], errs[i] = g.nodeMetrics(r.Context(), n)
		}()
	}
	wg.Wait()
	merged := map[string]*dto.MetricFamily{}
	up := &dto.MetricFamily{Name: proto.String(NodeUpMetric), Help: proto.String("Whether the node answered the gateway's scrape."), Type: dto.MetricType_GAUGE.Enum()}
	merged[up.GetName()] = up
	for i, n := range nodes {
		v := 1.0
		if errs[i] != nil {
			v = 0
			g.log.Warn("node metrics", "node", n.Name, "err", errs[i])
		}
		up.Metric = append(up.Metric, &dto.Metric{Label: []*dto.LabelPair{nodeLabel(n.Name)}, Gauge: &dto.Gauge{Value: proto.Float64(v)}})
		for name, f := range fams[i] {
			m, ok := merged[name]
			if !ok {
				m = &dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type, Unit: f.Unit}
				merged[name] = m
			}
			if m.GetType() != f.GetType() {
				continue // a node of another version: its family is left out
			}
			for _, metric := range f.Metric {
				metric.Label = append(metric.Label, nodeLabel(n.Name))
				m.Metric = append(m.Metric, metric)
			}
		}
	}
	names := make([]string, 0, len(merged))
	for name := range merged {
		names = append(names, name)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	for _, name := range names {
		if _, err := expfmt.MetricFamilyToText(&buf, merged[name]); err != nil {
			writeError(w, errdefs.Wrap(errdefs.Internal, err, "metrics: encode %s", name))
			return
		}
	}
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	_, _ = w.Write(buf.Bytes()) // a failed write means the scraper left
}

func nodeLabel(name string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String("node"), Value: proto.String(name)}
}

// nodeMetrics scrapes node n's /metrics in the text format.
func (g *Gateway) nodeMetrics(ctx context.Context, n Node) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opt.NodeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(n.URL, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	g.authorize(req.Header, nil)
	res, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(io.LimitReader(res.Body, maxMetricsBytes))
}
