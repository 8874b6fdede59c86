package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

const auditE2BKey = "e2b_00112233445566778899aabbccddeeff"

// auditDaemon starts a daemon with its E2B listener on (for its
// authentication failures); tweak changes the configuration first.
func auditDaemon(t testing.TB, tweak func(*config.Config)) (*testenv.Daemon, string) {
	t.Helper()
	d := testenv.NewDaemon(t)
	keys := filepath.Join(t.TempDir(), "e2b-keys")
	if err := os.WriteFile(keys, []byte(auditE2BKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e2bAddr := testenv.FreeAddr(t)
	d.Config.E2B = config.E2B{Listen: e2bAddr, APIKeyFile: keys}
	if tweak != nil {
		tweak(d.Config)
	}
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	return d, e2bAddr
}

func auditDir(d *testenv.Daemon) string { return filepath.Join(d.Config.Paths.StateDir, "audit") }

// auditRecords reads every whole record of the daemon's log.
func auditRecords(t *testing.T, dir string) []audit.Record {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	sort.Strings(names)
	var out []audit.Record
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, ln := range bytes.Split(b, []byte("\n")) {
			var r audit.Record
			if len(ln) > 0 && json.Unmarshal(ln, &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

func verifyJSON(t *testing.T, d *testenv.Daemon, args ...string) (*apitypes.AuditReport, int) {
	t.Helper()
	out, errOut, code := d.Ctl(append([]string{"--json", "audit", "verify"}, args...)...)
	var rep apitypes.AuditReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit verify %v: exit %d, %v\n%s\n%s", args, code, err, out, errOut)
	}
	return &rep, code
}

// TestAuditLog: 8 concurrent clients through REST and MCP over HTTP, with
// authentication failures on REST, MCP and E2B; the log verifies, holds
// every call that was answered, names its callers; and every kind of
// tampering is named — on copies through `sandboxctl audit verify --dir`,
// and on the live log through the daemon.
func TestAuditLog(t *testing.T) {
	testenv.RequireRoot(t)
	d, e2bAddr := auditDaemon(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base := "http://" + d.HTTPAddr
	c, err := client.New(client.Options{URL: base, Token: d.Token()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	const clients, each = 8, 6
	var answered atomic.Int64
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := c.Exec(ctx, sb.ID, apitypes.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
					t.Errorf("client %d exec %d: %v", g, i, err)
					return
				}
				answered.Add(1)
			}
			// A wrong key on each front end, from a loopback address of
			// this client's own: the authenticator limits failures per
			// source (pkg/tenants), and 24 from one address would lock
			// the others' right key out with it.
			wrong := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
				LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+g))}}).DialContext}}
			defer wrong.CloseIdleConnections()
			for _, u := range []string{base + "/v1/sandboxes", base + "/mcp"} {
				req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader("{}"))
				req.Header.Set("Authorization", "Bearer wrong-"+fmt.Sprint(g))
				if res, err := wrong.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
					t.Errorf("wrong token on %s: %v %v", u, res, err)
				} else {
					res.Body.Close()
				}
			}
			req, _ := http.NewRequest(http.MethodPost, "http://"+e2bAddr+"/sandboxes", strings.NewReader("{}"))
			req.Header.Set("X-API-Key", "e2b_ffffffffffffffffffff")
			if res, err := wrong.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
				t.Errorf("wrong E2B key: %v %v", res, err)
			} else {
				res.Body.Close()
			}
		}()
	}
	wg.Wait()
	// One MCP tool call that changes something.
	mc, err := mcpclient.NewStreamableHttpClient(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + d.Token()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "audit-test", Version: "0"}
	if _, err := mc.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	call := mcp.CallToolRequest{}
	call.Params.Name = "exec_command"
	call.Params.Arguments = map[string]any{"sandbox_id": sb.ID, "argv": []string{"true"}}
	if res, err := mc.CallTool(ctx, call); err != nil || res.IsError {
		t.Fatalf("MCP exec: %v %+v", err, res)
	}
	mc.Close()

	rep, code := verifyJSON(t, d)
	if code != 0 || !rep.OK {
		t.Fatalf("verify of the live log: exit %d, %+v", code, rep)
	}
	recs := auditRecords(t, auditDir(d))
	if rep.Records != uint64(len(recs)) {
		t.Fatalf("verify counted %d records, the files hold %d", rep.Records, len(recs))
	}
	count := map[string]int{}
	for _, r := range recs {
		switch {
		case r.Action == "POST /v1/sandboxes/{id}/exec" && r.Target == sb.ID && r.KeyName == "auth-token-file" && r.FrontEnd == "rest" && r.Outcome == audit.Success && strings.HasPrefix(r.Source, "127.0.0.1:"):
			count["rest exec"]++
		case r.Action == audit.ActionAuthenticate && r.Code == "unauthenticated" && r.KeyID == "" && r.Outcome == audit.Failure:
			count["auth "+r.FrontEnd]++
		case r.Action == "mcp:exec_command" && r.Target == sb.ID && r.FrontEnd == "mcp" && r.KeyName == "auth-token-file":
			count["mcp exec"]++
		case r.Action == "POST /v1/sandboxes" && r.Outcome == audit.Success && r.Target == sb.ID:
			count["create"]++
		}
		if strings.Contains(string(mustJSON(r)), d.Token()) || strings.Contains(string(mustJSON(r)), "wrong-") {
			t.Fatalf("a record holds a secret: %+v", r)
		}
	}
	want := map[string]int{"rest exec": int(answered.Load()), "auth rest": clients, "auth mcp": clients, "auth e2b": clients, "mcp exec": 1, "create": 1}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("%s records: %d, want %d (all: %v)", k, count[k], n, count)
		}
	}

	// Tampering with copies, named by the offline verifier.
	orig, err := os.ReadFile(filepath.Join(auditDir(d), "audit-00000000000000000001.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ls := bytes.SplitAfter(orig, []byte("\n"))
	ls = ls[:len(ls)-1] // the empty piece after the last newline
	if len(ls) < 20 {
		t.Fatalf("only %d lines", len(ls))
	}
	cases := []struct {
		name   string
		tamper func([][]byte) [][]byte
		kind   string
		seq    uint64
	}{
		{"one byte changed", func(l [][]byte) [][]byte {
			b := bytes.Clone(l[6])
			i := bytes.Index(b, []byte(`"outcome":"`)) + len(`"outcome":"`)
			b[i] ^= 0x20 // success → Success
			l[6] = b
			return l
		}, audit.Edited, 7},
		{"a line removed", func(l [][]byte) [][]byte { return append(l[:10:10], l[11:]...) }, audit.Removed, 11},
		{"two lines swapped", func(l [][]byte) [][]byte { l[12], l[13] = l[13], l[12]; return l }, audit.Reordered, 13},
		{"a line added", func(l [][]byte) [][]byte { return append(append(l[:15:15], l[2]), l[15:]...) }, audit.Inserted, 3},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		tampered := bytes.Join(tc.tamper(append([][]byte(nil), ls...)), nil)
		if err := os.WriteFile(filepath.Join(dir, "audit-00000000000000000001.jsonl"), tampered, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, code := verifyJSON(t, d, "--dir", dir)
		if code == 0 || rep.OK || rep.Problem == nil || rep.Problem.Kind != tc.kind || rep.Problem.Seq != tc.seq {
			t.Errorf("%s: exit %d, report %+v problem %+v; want %s record %d", tc.name, code, rep, rep.Problem, tc.kind, tc.seq)
		}
	}
	// The human form names the record too, and exits 1.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "audit-00000000000000000001.jsonl"), bytes.Join(cases[1].tamper(append([][]byte(nil), ls...)), nil), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _, code := d.Ctl("audit", "verify", "--dir", dir); code != 1 || !strings.Contains(out, "FAILED: record 11 removed") {
		t.Errorf("human verify of a removed line: exit %d %q", code, out)
	}

	// Tampering with the live log: the daemon's verify names the record,
	// and its checkpoints catch a tail cut off.
	live := filepath.Join(auditDir(d), "audit-00000000000000000001.jsonl")
	edited := bytes.Replace(orig, []byte(`"key_name":"auth-token-file"`), []byte(`"key_name":"auth-token-filf"`), 1)
	first := bytes.Count(orig[:bytes.Index(orig, []byte(`"key_name":"auth-token-file"`))], []byte("\n")) + 1
	if err := os.WriteFile(live, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, code = verifyJSON(t, d)
	if code == 0 || rep.Problem == nil || rep.Problem.Kind != audit.Edited || rep.Problem.Seq != uint64(first) {
		t.Errorf("live edit of record %d: exit %d, %+v", first, code, rep.Problem)
	}
	if err := os.WriteFile(live, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	// Export: OCSF API Activity, since filters.
	exp := d.MustCtl("audit", "export", "--since", "1h")
	evs := strings.Split(strings.TrimSpace(exp), "\n")
	var ev map[string]any
	if err := json.Unmarshal([]byte(evs[0]), &ev); err != nil || ev["class_uid"] != float64(6003) || ev["category_uid"] != float64(6) {
		t.Fatalf("export: %v %v", err, evs[0])
	}
	if len(evs) < len(recs) {
		t.Errorf("export --since 1h wrote %d events, the log holds %d records", len(evs), len(recs))
	}
	if future := d.MustCtl("audit", "export", "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); strings.TrimSpace(future) != "" {
		t.Errorf("export since the future: %q", future)
	}
	if _, errOut, code := d.Ctl("audit", "export", "--since", "yesterday"); code != 2 || !strings.Contains(errOut, "since") {
		t.Errorf("export --since yesterday: exit %d %q", code, errOut)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestAuditCrash: kill -9 of the daemon under load from 8 clients leaves a
// log that verifies up to its last whole record and holds every call that
// was answered; the restarted daemon continues the chain.
func TestAuditCrash(t *testing.T) {
	testenv.RequireRoot(t)
	d, _ := auditDaemon(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.New(client.Options{URL: "http://" + d.HTTPAddr, Token: d.Token()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	var answered atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				path := fmt.Sprintf("/workspace/f%d", answered.Load())
				if _, err := c.WriteFile(ctx, sb.ID, path, 0o644, false, 1, strings.NewReader("x")); err != nil {
					return // the daemon died
				}
				answered.Add(1)
			}
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); answered.Load() < 100 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // polls the load, not a synchronisation
	}
	d.Crash()
	acked := answered.Load()
	close(stop)
	wg.Wait()
	if acked < 100 {
		t.Fatalf("only %d writes answered before the kill", acked)
	}
	rep, code := verifyJSON(t, d, "--dir", auditDir(d))
	if code != 0 || !rep.OK {
		t.Fatalf("after kill -9: exit %d, %+v %+v", code, rep, rep.Problem)
	}
	writes := 0
	for _, r := range auditRecords(t, auditDir(d)) {
		if r.Action == "PUT /v1/sandboxes/{id}/files" && r.Outcome == audit.Success {
			writes++
		}
	}
	if int64(writes) < acked {
		t.Fatalf("%d writes were answered, the log holds %d", acked, writes)
	}
	last := rep.LastSeq
	d.Start()
	d.MustCtl("exec", sb.ID, "--", "true")
	rep, code = verifyJSON(t, d)
	if code != 0 || !rep.OK || rep.LastSeq <= last {
		t.Fatalf("after restart: exit %d, %+v (last before %d)", code, rep, last)
	}
}

// BenchmarkExecAudit measures exec over HTTP with the bearer token, with
// the audit log on and off, alternating between two daemons in one run;
// it reports the medians and their difference (what authentication's
// record and the audit append add).
func BenchmarkExecAudit(b *testing.B) {
	testenv.RequireRoot(b)
	on, _ := auditDaemon(b, nil)
	off, _ := auditDaemon(b, func(c *config.Config) { c.Audit.Enabled = false })
	ctx := context.Background()
	type target struct {
		c  *client.Client
		id string
		ds []time.Duration
	}
	var ts []*target
	for _, d := range []*testenv.Daemon{on, off} {
		c, err := client.New(client.Options{URL: "http://" + d.HTTPAddr, Token: d.Token()})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		sb, err := c.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
		if err != nil {
			b.Fatal(err)
		}
		ts = append(ts, &target{c: c, id: sb.ID})
	}
	for _, tg := range ts { // warm up
		for range 5 {
			if _, err := tg.c.Exec(ctx, tg.id, apitypes.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, tg := range ts {
			start := time.Now()
			if _, err := tg.c.Exec(ctx, tg.id, apitypes.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
				b.Fatal(err)
			}
			tg.ds = append(tg.ds, time.Since(start))
		}
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	mOn, mOff := med(ts[0].ds), med(ts[1].ds)
	b.ReportMetric(float64(mOn.Microseconds())/1000, "ms-median-audit-on")
	b.ReportMetric(float64(mOff.Microseconds())/1000, "ms-median-audit-off")
	b.ReportMetric(float64((mOn-mOff).Microseconds())/1000, "ms-audit-cost")
}
