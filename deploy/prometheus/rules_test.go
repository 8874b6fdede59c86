package prometheus

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// promtool is Debian's (package prometheus, scripts/install-deps.sh).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		testenv.SkipOrFail(t, "promtool not installed (Debian package prometheus): %v", err)
	}
	return p
}

// TestRulesCheck: promtool accepts the rules (syntax, PromQL, templates).
func TestRulesCheck(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", "rules.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestRulesUnit: every alert fires, and stays silent, where rules_test.yaml
// says; and every alert of rules.yaml has a test there.
func TestRulesUnit(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", "rules_test.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules(t) {
		if r.Alert == "" {
			continue
		}
		if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
			t.Errorf("alert %s has no test in rules_test.yaml", r.Alert)
		}
	}
}

// TestDashboardQueries: every query of the Grafana dashboard is valid
// PromQL (promtool checks it as a recording rule, Grafana's variables set
// to what they stand for), and every panel reads the dashboard's
// datasource variable.
func TestDashboardQueries(t *testing.T) {
	d := dashboard(t)
	var file strings.Builder
	file.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range d.queries() {
		expr := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*").Replace(q.Expr)
		b, _ := json.Marshal(expr)
		file.WriteString("      - record: dashboard:query_" + strconv.Itoa(i) + "\n        expr: " + string(b) + "\n")
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("the dashboard's queries: %v\n%s\n%s", err, out, file.String())
	}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q reads datasource %+v, not the dashboard's ${datasource}", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != "${datasource}" {
				t.Errorf("a query of panel %q reads datasource %+v", p.Title, tg.Datasource)
			}
		}
	}
}

type rule struct {
	Alert  string `json:"alert"`
	Record string `json:"record"`
	Expr   string `json:"expr"`
}

// rules parses rules.yaml.
func rules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				rule
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("rules.yaml: %v", err)
	}
	var out []rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, r.rule)
		}
	}
	return out
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type query struct {
	Expr       string     `json:"expr"`
	Datasource datasource `json:"datasource"`
}

type grafanaDashboard struct {
	Panels []struct {
		Type       string     `json:"type"`
		Title      string     `json:"title"`
		Datasource datasource `json:"datasource"`
		Targets    []query    `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// queries are the PromQL expressions of the panels.
func (d grafanaDashboard) queries() []query {
	var out []query
	for _, p := range d.Panels {
		out = append(out, p.Targets...)
	}
	return out
}

func dashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile("../grafana/mcp-sandboxd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/mcp-sandboxd.json: %v", err)
	}
	if len(d.queries()) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return d
}
