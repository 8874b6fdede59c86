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
	SandboxID        string                 `json:"sandbox_id"`
	First            toolResult             `json:"first"`
	FirstAt          int64                  `json:"first_at"` // ms since the client started
	FirstMS          int64                  `json:"first_ms"`
	AskedAfterFirst  int                    `json:"asked_after_first"`
	Second           toolResult             `json:"second"`
	Hello            apitypes.CommandResult `json:"hello"`
	Status           apitypes.NetworkStatus `json:"status"`
	AskedBeforeFresh int                    `json:"asked_before_fresh"`
	Fresh            struct {
		IsError           bool               `json:"isError"`
		StructuredContent apitypes.RunResult `json:"structuredContent"`
	} `json:"fresh"`
	FreshAt int64 `json:"fresh_at"`
	Asked   []struct {
		Mode            string         `json:"mode"`
		Message         string         `json:"message"`
		RequestedSchema map[string]any `json:"requestedSchema"`
		At              int64          `json:"at"`
	} `json:"asked"`
	Errors []string `json:"errors"`
}

// TestNetworkApproval: network approvals through elicitation, with the
// official TypeScript SDK as the client over the network test topology
// (the daemon in a simulated host namespace, a PEP 503 package index and
// DNS upstream; the machine's namespace untouched). An allowlist sandbox
// is refused the index's host by pip: a client that declared elicitation
// is asked once (form mode, a boolean) while pip's lookup is held, and
// after its yes the host is in the allowlist and that same pip install
// succeeds — over HTTP with the answer 12 s late, longer than glibc
// waits with its default resolver options (5 s x 2); the approval is in
// the audit log; a fresh run_code sandbox in allowlist mode asks as well
// and its pip install -r requirements.txt succeeds. A client that
// declines, or that declared no elicitation (not held: not slowed),
// keeps today's refusal; every result reports the refused host and the
// allowlist that would have let it through.
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
	// run_code's fresh sandbox installs from the index (PIP_INDEX_URL).
	d.Config.Network.PackageIndexes.PipIndexURL = "http://" + indexHost + "/simple/"
	d.Config.Audit.Enabled = true
	d.Config.Audit.Dir = filepath.Join(t.TempDir(), "audit")
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	hold := d.Config.Network.ApprovalHold.D()
	d.Wrapper = []string{"nsenter", "--net=/run/netns/" + tp.Host}
	d.Start()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.Log(), "mcp-sandboxd ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready\n%s", d.Log())
		}
	}
	run := func(t *testing.T, answer string, tweak map[string]any) approvalReport {
		t.Helper()
		tr := httpTransport(d)
		if strings.HasSuffix(t.Name(), "stdio") {
			tr = stdioTransport(d)
		}
		tr["answer"] = answer
		for k, v := range tweak {
			tr[k] = v
		}
		var r approvalReport
		if err := runClientIn(tp.Host, "approval", tr, 0, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Errors) > 0 {
			t.Errorf("client errors: %q", r.Errors)
		}
		t.Logf("answer %s: first pip install %d ms, questions %d", answer, r.FirstMS, len(r.Asked))
		return r
	}
	// refusedFirst: the first install is refused (no yes) and says so.
	refusedFirst := func(t *testing.T, answer string, r approvalReport) {
		t.Helper()
		f := r.First.StructuredContent
		if r.First.IsError || f.ExitCode == nil || *f.ExitCode == 0 || f.NetworkRefusals == nil ||
			!slices.Equal(f.NetworkRefusals.Refused, []string{indexHost}) ||
			!slices.Equal(f.NetworkRefusals.ProposedAllow, []string{"other.example.test", indexHost}) ||
			!strings.Contains(r.First.text(), "network: refused "+indexHost) {
			t.Fatalf("first pip install (answer %s): %+v %+v\n%s", answer, f, f.NetworkRefusals, r.First.text())
		}
	}

	yes := func(t *testing.T) {
		stdio := strings.HasSuffix(t.Name(), "stdio")
		tweak := map[string]any{}
		const delay = 12 * time.Second
		if !stdio {
			// Later than glibc's default resolver options would wait
			// (5 s x 2) and than the old ones (2 s x 2).
			tweak["delay_ms"] = delay.Milliseconds()
			tweak["fresh"] = true
		}
		r := run(t, "yes", tweak)
		if len(r.Asked) < 1 || r.AskedAfterFirst != 1 || r.Asked[0].Mode != "form" ||
			!strings.Contains(r.Asked[0].Message, "Allow "+indexHost+" for sandbox "+r.SandboxID+"?") {
			t.Fatalf("elicitations: %+v (after the first call %d), want one asking about %s", r.Asked, r.AskedAfterFirst, indexHost)
		}
		// Asked during the call: the question came before its result,
		// which came after the answer.
		if r.Asked[0].At >= r.FirstAt || (!stdio && r.FirstMS < delay.Milliseconds()) {
			t.Errorf("question at %d ms, first result at %d ms (the call took %d ms): not asked during the call", r.Asked[0].At, r.FirstAt, r.FirstMS)
		}
		props, _ := r.Asked[0].RequestedSchema["properties"].(map[string]any)
		allow, _ := props["allow"].(map[string]any)
		if allow["type"] != "boolean" {
			t.Errorf("requested schema %v, want a boolean allow", r.Asked[0].RequestedSchema)
		}
		// The same call installed, and reports the approval.
		f := r.First.StructuredContent
		if r.First.IsError || f.ExitCode == nil || *f.ExitCode != 0 || f.NetworkRefusals == nil ||
			!slices.Equal(f.NetworkRefusals.Approved, []string{indexHost}) || len(f.NetworkRefusals.Refused) != 0 ||
			!slices.Equal(f.NetworkRefusals.ProposedAllow, []string{"other.example.test", indexHost}) ||
			!strings.Contains(r.First.text(), "allowed during this call after your approval: "+indexHost) {
			t.Fatalf("pip install approved during the call: %+v %+v\n%s", f, f.NetworkRefusals, r.First.text())
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
		wantDownloads := 2 // the approved install and the second one
		if !stdio {
			// run_code's fresh sandbox: asked, and its install went on.
			fr := r.Fresh.StructuredContent
			if len(r.Asked) != 2 || r.AskedBeforeFresh != 1 || r.Asked[1].At >= r.FreshAt ||
				!strings.Contains(r.Asked[1].Message, "Allow "+indexHost+" for sandbox "+fr.SandboxID+"?") {
				t.Errorf("fresh run_code: questions %+v (before it %d), result at %d ms", r.Asked, r.AskedBeforeFresh, r.FreshAt)
			}
			if r.Fresh.IsError || !fr.Success || fr.Stdout != "hello from the index\n" || fr.NetworkRefusals == nil ||
				!slices.Equal(fr.NetworkRefusals.Approved, []string{indexHost}) || !slices.Equal(fr.NetworkRefusals.ProposedAllow, []string{indexHost}) {
				t.Errorf("fresh run_code after the yes: %+v %+v", fr, fr.NetworkRefusals)
			}
			wantDownloads++
		} else if len(r.Asked) != 1 {
			t.Errorf("%d questions, want 1: %+v", len(r.Asked), r.Asked)
		}
		mu.Lock()
		n := downloads
		downloads = 0
		mu.Unlock()
		if n != wantDownloads {
			t.Errorf("the index served the wheel %d times, want once per install (%d)", n, wantDownloads)
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
	// A client that goes away while it is asked: the held lookup is
	// released at once (the forwarder records the refusal only then),
	// not at the end of the hold, and the allowlist stays.
	t.Run("disconnect", func(t *testing.T) {
		var r struct {
			AskedAt       int64                  `json:"asked_at"`
			ClosedAt      int64                  `json:"closed_at"`
			Call          string                 `json:"call"`
			ReleasedAfter int64                  `json:"released_after"`
			Status        apitypes.NetworkStatus `json:"status"`
			Errors        []string               `json:"errors"`
		}
		if err := runClientIn(tp.Host, "approvaldisconnect", httpTransport(d), 0, &r); err != nil {
			t.Fatal(err)
		}
		t.Logf("asked at %d ms, closed at %d ms, refusal recorded %d ms after the close; call: %s", r.AskedAt, r.ClosedAt, r.ReleasedAfter, r.Call)
		if r.AskedAt < 0 || r.ClosedAt < r.AskedAt || r.Call == "returned" {
			t.Fatalf("not asked, or the call returned to a closed client: %+v", r)
		}
		if !slices.Contains(r.Status.Counters.DeniedDestinations, indexHost) ||
			time.Duration(r.ReleasedAfter)*time.Millisecond >= hold/3 {
			t.Errorf("held lookup not released after the client left: %d ms (hold %v), denied %v", r.ReleasedAfter, hold, r.Status.Counters.DeniedDestinations)
		}
		if !slices.Equal(r.Status.Allow, []string{"other.example.test"}) {
			t.Errorf("allowlist changed without an answer: %+v", r.Status)
		}
	})
	for _, answer := range []string{"no", "none"} {
		t.Run(answer, func(t *testing.T) {
			r := run(t, answer, nil)
			refusedFirst(t, answer, r)
			want := 1
			if answer == "none" {
				want = 0
			}
			if len(r.Asked) != want || r.AskedAfterFirst != want {
				t.Fatalf("%d elicitations (%d after the first call), want %d: %+v", len(r.Asked), r.AskedAfterFirst, want, r.Asked)
			}
			if want == 1 && r.Asked[0].At >= r.FirstAt {
				t.Errorf("question at %d ms, after the first result (%d ms)", r.Asked[0].At, r.FirstAt)
			}
			// Not held without elicitation, nor after an answer: the
			// refusal comes well within the hold.
			if time.Duration(r.FirstMS)*time.Millisecond >= hold/2 {
				t.Errorf("refused pip install took %d ms (hold %v)", r.FirstMS, hold)
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
