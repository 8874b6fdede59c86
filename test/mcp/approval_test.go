package mcp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// indexHost is the package index's name in the topology's DNS.
const indexHost = "pkg.example.test"

type toolResult struct {
	IsError           bool                   `json:"isError"`
	StructuredContent apitypes.CommandResult `json:"structuredContent"`
	Content           []struct {
		Text string `json:"text"`
	} `json:"content"`
}

func (r toolResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

type approvalReport struct {
	SandboxID       string                 `json:"sandbox_id"`
	First           toolResult             `json:"first"`
	AskedAfterFirst int                    `json:"asked_after_first"`
	Second          toolResult             `json:"second"`
	Hello           apitypes.CommandResult `json:"hello"`
	Status          apitypes.NetworkStatus `json:"status"`
	Asked           []struct {
		Mode            string         `json:"mode"`
		Message         string         `json:"message"`
		RequestedSchema map[string]any `json:"requestedSchema"`
	} `json:"asked"`
	Errors []string `json:"errors"`
}

// TestNetworkApproval: network approvals through elicitation, with the
// official TypeScript SDK as the client over the network test topology
// (the daemon in a simulated host namespace, a PEP 503 package index and
// DNS upstream; the machine's namespace untouched). An allowlist sandbox
// is refused the index's host by pip: a client that declared elicitation
// is asked once (form mode, a boolean), and after its yes the host is in
// the allowlist and the same pip install succeeds; the approval is in
// the audit log. A client that declines, or that declared no
// elicitation, keeps today's refusal; every result reports the refused
// host and the allowlist that would have let it through.
func TestNetworkApproval(t *testing.T) {
	testenv.RequireRoot(t)
	node(t)
	tp := testenv.NewTopology(t, "sbxa")
	var mu sync.Mutex
	downloads := 0
	whl := testenv.Wheel(t, "greetpkg", "1.0", "def hello():\n    return 'hello from the index'\n")
	const file = "greetpkg-1.0-py3-none-any.whl"
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/greetpkg/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s">%s</a></body></html>`, file, file)
	})
	mux.HandleFunc("/files/"+file, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		downloads++
		mu.Unlock()
		w.Write(whl)
	})
	tp.ServeHTTP(t, ":80", mux)
	tp.ServeDNS(t, map[string]string{indexHost + ".": testenv.UpstreamAddr, "other.example.test.": "203.0.113.10"})

	d := testenv.NewDaemon(t, "python")
	d.Config.Network.DNS = []string{testenv.UpstreamAddr}
	d.Config.Audit.Enabled = true
	d.Config.Audit.Dir = filepath.Join(t.TempDir(), "audit")
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Wrapper = []string{"nsenter", "--net=/run/netns/" + tp.Host}
	d.Start()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.Log(), "mcp-sandboxd ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready\n%s", d.Log())
		}
	}
	run := func(t *testing.T, answer string) approvalReport {
		t.Helper()
		tr := httpTransport(d)
		if strings.HasSuffix(t.Name(), "stdio") {
			tr = stdioTransport(d)
		}
		tr["answer"] = answer
		var r approvalReport
		if err := runClientIn(tp.Host, "approval", tr, 0, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Errors) > 0 {
			t.Errorf("client errors: %q", r.Errors)
		}
		// The first install is refused whatever the answer, and says so.
		f := r.First.StructuredContent
		if r.First.IsError || f.ExitCode == nil || *f.ExitCode == 0 || f.NetworkRefusals == nil ||
			!slices.Equal(f.NetworkRefusals.Refused, []string{indexHost}) ||
			!slices.Equal(f.NetworkRefusals.ProposedAllow, []string{"other.example.test", indexHost}) ||
			!strings.Contains(r.First.text(), "network: refused "+indexHost) {
			t.Fatalf("first pip install (answer %s): %+v %+v\n%s", answer, f, f.NetworkRefusals, r.First.text())
		}
		return r
	}

	yes := func(t *testing.T) {
		r := run(t, "yes")
		if len(r.Asked) != 1 || r.AskedAfterFirst != 1 || r.Asked[0].Mode != "form" ||
			!strings.Contains(r.Asked[0].Message, "Allow "+indexHost+" for sandbox "+r.SandboxID+"?") {
			t.Fatalf("elicitations: %+v (after the first call %d), want one asking about %s", r.Asked, r.AskedAfterFirst, indexHost)
		}
		props, _ := r.Asked[0].RequestedSchema["properties"].(map[string]any)
		allow, _ := props["allow"].(map[string]any)
		if allow["type"] != "boolean" {
			t.Errorf("requested schema %v, want a boolean allow", r.Asked[0].RequestedSchema)
		}
		if !slices.Equal(r.First.StructuredContent.NetworkRefusals.Approved, []string{indexHost}) ||
			!strings.Contains(r.First.text(), "allowed now after your approval: "+indexHost) {
			t.Errorf("first result does not report the approval: %+v", r.First.StructuredContent.NetworkRefusals)
		}
		s := r.Second.StructuredContent
		if r.Second.IsError || s.ExitCode == nil || *s.ExitCode != 0 || s.NetworkRefusals != nil {
			t.Fatalf("pip install after the yes: %+v\n%s", s, r.Second.text())
		}
		if r.Hello.Stdout != "hello from the index\n" {
			t.Errorf("import after install: %+v", r.Hello)
		}
		if !slices.Equal(r.Status.Allow, []string{"other.example.test", indexHost}) || r.Status.Mode != "allowlist" {
			t.Errorf("network status after the yes: %+v", r.Status)
		}
		mu.Lock()
		n := downloads
		downloads = 0
		mu.Unlock()
		if n != 1 {
			t.Errorf("the index served the wheel %d times, want once", n)
		}
		recs := auditRecords(t, d.Config.Audit.Dir)
		if !slices.ContainsFunc(recs, func(rec audit.Record) bool {
			return rec.Action == "mcp:network_approval" && rec.Target == r.SandboxID+" allow "+indexHost && rec.Outcome == audit.Success && rec.KeyName != ""
		}) {
			t.Errorf("no audit record of the approval among %d records", len(recs))
		}
	}
	t.Run("yes", yes)
	// Over stdio the bridge relays the server's elicitation/create to the
	// client and its answer back.
	t.Run("yes-stdio", yes)
	for _, answer := range []string{"no", "none"} {
		t.Run(answer, func(t *testing.T) {
			r := run(t, answer)
			want := 1
			if answer == "none" {
				want = 0
			}
			if len(r.Asked) != want {
				t.Fatalf("%d elicitations, want %d: %+v", len(r.Asked), want, r.Asked)
			}
			if r.First.StructuredContent.NetworkRefusals.Approved != nil {
				t.Errorf("approved without a yes: %+v", r.First.StructuredContent.NetworkRefusals)
			}
			if s := r.Second.StructuredContent; s.ExitCode == nil || *s.ExitCode == 0 {
				t.Fatalf("pip install succeeded without approval: %+v", s)
			}
			if r.Hello.ExitCode == nil || *r.Hello.ExitCode == 0 {
				t.Errorf("import without the package worked: %+v", r.Hello)
			}
			if !slices.Equal(r.Status.Allow, []string{"other.example.test"}) {
				t.Errorf("allowlist changed without a yes: %+v", r.Status)
			}
		})
	}
}

// auditRecords reads every record of the audit log in dir.
func auditRecords(t *testing.T, dir string) []audit.Record {
	t.Helper()
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	for _, f := range files {
		fh, err := os.Open(filepath.Join(dir, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var rec audit.Record
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Action != "" {
				recs = append(recs, rec)
			}
		}
		fh.Close()
	}
	return recs
}
