// Package prometheus holds the alert rules of mcp-sandboxd (rules.yaml, in
// Prometheus's rule format; the Helm chart's PrometheusRule carries a copy)
// and their tests: promtool checks them and runs their unit tests
// (rules_test.yaml), and every metric the rules and the Grafana dashboard
// (deploy/grafana) name is checked against a real daemon's /metrics, so
// neither can drift from what the daemon exports. It has no code of its
// own.
package prometheus
