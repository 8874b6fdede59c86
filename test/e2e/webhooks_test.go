package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// receiver is a webhook receiver on loopback: it records every request
// per path, and answers 500 to the first fail[path] requests of a path
// ("/dead" always).
type receiver struct {
	url  string
	mu   sync.Mutex
	got  map[string][]delivery
	fail map[string]int
	hit  chan string // the path of each request, when someone waits
}

type delivery struct {
	headers map[string]string
	body    []byte
	status  int
	at      time.Time
}

func newReceiver(t *testing.T) *receiver {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{url: "http://" + l.Addr().String(), got: map[string][]delivery{}, fail: map[string]int{}, hit: make(chan string, 1024)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		d := delivery{headers: map[string]string{}, body: body, status: http.StatusNoContent, at: time.Now()}
		for _, h := range []string{"webhook-id", "webhook-timestamp", "webhook-signature", "content-type"} {
			d.headers[h] = req.Header.Get(h)
		}
		r.mu.Lock()
		if req.URL.Path == "/dead" || r.fail[req.URL.Path] > 0 {
			r.fail[req.URL.Path]--
			d.status = http.StatusInternalServerError
		}
		r.got[req.URL.Path] = append(r.got[req.URL.Path], d)
		r.mu.Unlock()
		select {
		case r.hit <- req.URL.Path:
		default:
		}
		w.WriteHeader(d.status)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *receiver) deliveries(path string) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got[path]...)
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// verify runs the standardwebhooks npm package (test/webhooks) over
// deliveries and returns its verdict for each.
func verify(t *testing.T, secret string, ds []delivery) []string {
	t.Helper()
	type in struct {
		Secret  string            `json:"secret"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	var ins []in
	for _, d := range ds {
		ins = append(ins, in{secret, d.headers, string(d.body)})
	}
	data, _ := json.Marshal(ins)
	cmd := exec.Command("node", "../webhooks/verify.mjs")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("verifier (scripts/install-deps.sh installs test/webhooks): %v %s", err, out)
	}
	var verdicts []string
	if err := json.Unmarshal(out, &verdicts); err != nil {
		t.Fatalf("verifier output %q: %v", out, err)
	}
	return verdicts
}

func payloadOf(t *testing.T, d delivery) apitypes.WebhookPayload {
	t.Helper()
	var p apitypes.WebhookPayload
	if err := json.Unmarshal(d.body, &p); err != nil {
		t.Fatalf("payload %s: %v", d.body, err)
	}
	return p
}

// TestWebhooks drives lifecycle webhooks through the daemon's REST API as
// two tenants and the administrator: bad registrations refused naming
// the field; a tenant's hook gets its sandbox's created, ready and killed
// events, signed so that the standardwebhooks verifier accepts them and
// refuses a tampered one, and nothing of the other tenant's; a delivery
// whose receiver fails survives a kill -9 of the daemon mid-retry and is
// delivered after the restart with the same webhook-id; a hook that keeps
// failing is disabled, says why and is in the audit log; a delivery is
// redelivered.
func TestWebhooks(t *testing.T) {
	d := testenv.NewDaemon(t)
	// Loopback receivers are allowed to every tenant here; 10/8 and
	// link-local stay the administrator's. Retries fast enough for a
	// test, and few failures before a hook is disabled.
	d.Config.Webhooks.AllowPrivate = []string{"127.0.0.1/32"}
	d.Config.Webhooks.RetryBase = config.Duration(200 * time.Millisecond)
	d.Config.Webhooks.RetryMax = config.Duration(time.Second)
	d.Config.Webhooks.DisableAfter = 4
	d.Config.Webhooks.MaxAttempts = 20
	writeConfig(t, d)
	d.Start()
	rcv := newReceiver(t)
	_, aliceKey := keyOf(t, d, "alice")
	_, bobKey := keyOf(t, d, "bob")
	alice := newTenantClient(t, d, aliceKey, "")
	bob := newTenantClient(t, d, bobKey, "")
	admin := newTenantClient(t, d, d.Token(), "")

	create := func(c *tenantClient, req map[string]any) (apitypes.Webhook, int, apiErr) {
		t.Helper()
		st, b := c.do("POST", "/v1/webhooks", req)
		var w apitypes.Webhook
		_ = json.Unmarshal(b, &w)
		return w, st, errOf(b)
	}

	// Bad input, refused with the taxonomy's code naming the field.
	for _, tc := range []struct {
		req        map[string]any
		code, text string
	}{
		{map[string]any{"url": "ftp://127.0.0.1/x"}, "invalid_argument", "url:"},
		{map[string]any{"url": "http://[::1"}, "invalid_argument", "url:"},
		{map[string]any{"url": "http://user:pw@127.0.0.1/"}, "invalid_argument", "url:"},
		{map[string]any{"url": ""}, "invalid_argument", "url:"},
		{map[string]any{"url": "http://10.1.2.3/hook"}, "permission_denied", "url:"},
		{map[string]any{"url": "http://169.254.169.254/latest"}, "permission_denied", "url:"},
		{map[string]any{"url": "http://[::1]:80/"}, "permission_denied", "url:"},
		{map[string]any{"url": rcv.url + "/alice", "timeout_ms": 50}, "invalid_argument", "timeout_ms:"},
		{map[string]any{"url": rcv.url + "/alice", "timeout_ms": 600000}, "invalid_argument", "timeout_ms:"},
		{map[string]any{"url": rcv.url + "/alice", "events": []string{"sandbox.lifecycle.exploded"}}, "invalid_argument", "events[0]:"},
		{map[string]any{"url": rcv.url + "/alice", "secret": "mine"}, "invalid_argument", "secret"},
	} {
		if _, st, e := create(alice, tc.req); st < 400 || e.Code != tc.code || !strings.Contains(e.Message, tc.text) {
			t.Errorf("create %v: %d %+v, want %s naming %q", tc.req, st, e, tc.code, tc.text)
		}
	}
	// The administrator may point a hook at a private address.
	if w, st, e := create(admin, map[string]any{"url": "http://10.1.2.3/hook", "enabled": false}); st != http.StatusCreated || w.State != "disabled" {
		t.Errorf("admin create at a private address: %d %+v", st, e)
	}

	aliceHook, st, e := create(alice, map[string]any{"name": "a", "url": rcv.url + "/alice",
		"events": []string{apitypes.EventSandboxCreated, apitypes.EventSandboxReady, apitypes.EventSandboxTerminated}})
	if st != http.StatusCreated || !strings.HasPrefix(aliceHook.Secret, "whsec_") || aliceHook.Tenant != "alice" {
		t.Fatalf("alice create: %d %+v %+v", st, aliceHook, e)
	}
	bobHook, st, _ := create(bob, map[string]any{"url": rcv.url + "/bob"})
	if st != http.StatusCreated {
		t.Fatalf("bob create: %d", st)
	}

	// The secret is shown once; each tenant sees its own hooks only.
	st, b := alice.do("GET", "/v1/webhooks/"+aliceHook.ID, nil)
	if st != http.StatusOK || strings.Contains(string(b), "whsec_") {
		t.Errorf("alice get: %d %s", st, b)
	}
	st, b = alice.do("GET", "/v1/webhooks", nil)
	var list apitypes.WebhookList
	_ = json.Unmarshal(b, &list)
	if st != http.StatusOK || len(list.Webhooks) != 1 || list.Webhooks[0].ID != aliceHook.ID {
		t.Errorf("alice list: %d %s", st, b)
	}
	for _, req := range [][2]string{{"GET", ""}, {"GET", "/deliveries"}, {"DELETE", ""}, {"PATCH", ""}} {
		var body any
		if req[0] == "PATCH" {
			body = map[string]any{"enabled": false}
		}
		if st, b := bob.do(req[0], "/v1/webhooks/"+aliceHook.ID+req[1], body); st != http.StatusNotFound || errOf(b).Code != "not_found" {
			t.Errorf("bob %s alice's hook%s: %d %s", req[0], req[1], st, b)
		}
	}

	// Alice's sandbox: created, ready and killed reach her hook, signed.
	sb, st, b := alice.createSandbox(nil)
	if st != http.StatusCreated {
		t.Fatalf("alice sandbox: %d %s", st, b)
	}
	if st, b := alice.do("DELETE", "/v1/sandboxes/"+sb, nil); st != http.StatusOK {
		t.Fatalf("terminate: %d %s", st, b)
	}
	waitFor(t, 2*time.Minute, "alice's three events", func() bool { return len(rcv.deliveries("/alice")) >= 3 })
	got := rcv.deliveries("/alice")
	types := map[string]apitypes.WebhookPayload{}
	for _, dl := range got {
		p := payloadOf(t, dl)
		if p.SandboxID != sb || p.SandboxTeamID != "alice" || p.Version != "v2" || dl.headers["webhook-id"] == "" {
			t.Errorf("alice's delivery: %s %v", dl.body, dl.headers)
		}
		types[p.Type] = p
	}
	if len(types) != 3 || types[apitypes.EventSandboxTerminated].EventData["cause"] == nil {
		t.Errorf("alice's event types: %v", types)
	}
	verdicts := verify(t, aliceHook.Secret, got)
	for i, v := range verdicts {
		if v != "ok" {
			t.Errorf("verifier on delivery %d: %s", i, v)
		}
	}
	tampered := got[0]
	tampered.body = bytes.Replace(tampered.body, []byte(sb), []byte("sb-000000000000"), 1)
	if v := verify(t, aliceHook.Secret, []delivery{tampered}); !strings.HasPrefix(v[0], "refused") {
		t.Errorf("verifier on a tampered body: %s", v[0])
	}
	if v := verify(t, bobHook.Secret, got[:1]); !strings.HasPrefix(v[0], "refused") {
		t.Errorf("verifier with another hook's secret: %s", v[0])
	}
	// Bob's hook (every type) received nothing of alice's sandbox.
	for _, dl := range rcv.deliveries("/bob") {
		if strings.Contains(string(dl.body), sb) {
			t.Errorf("bob got alice's event: %s", dl.body)
		}
	}

	// The delivery log, and a redelivery with the same webhook-id.
	st, b = alice.do("GET", "/v1/webhooks/"+aliceHook.ID+"/deliveries", nil)
	var dlist apitypes.WebhookDeliveryList
	_ = json.Unmarshal(b, &dlist)
	if st != http.StatusOK || len(dlist.Deliveries) != 3 {
		t.Fatalf("alice deliveries: %d %s", st, b)
	}
	for _, dl := range dlist.Deliveries {
		if dl.State != "delivered" || dl.Attempts != 1 {
			t.Errorf("delivery %+v", dl)
		}
	}
	again := dlist.Deliveries[0].ID
	if st, b := alice.do("POST", "/v1/webhooks/"+aliceHook.ID+"/deliveries/"+again+"/redeliver", nil); st != http.StatusAccepted {
		t.Fatalf("redeliver: %d %s", st, b)
	}
	waitFor(t, time.Minute, "the redelivery", func() bool { return len(rcv.deliveries("/alice")) >= 4 })
	if last := rcv.deliveries("/alice")[3]; last.headers["webhook-id"] != again || verify(t, aliceHook.Secret, []delivery{last})[0] != "ok" {
		t.Errorf("redelivery: %v", last.headers)
	}

	// A receiver that fails its first three attempts; the daemon is
	// killed -9 right after the first, and the delivery completes after
	// the restart, with the same message id.
	rcv.mu.Lock()
	rcv.fail["/flaky"] = 3
	rcv.mu.Unlock()
	flaky, st, _ := create(alice, map[string]any{"url": rcv.url + "/flaky", "events": []string{apitypes.EventSandboxCreated}})
	if st != http.StatusCreated {
		t.Fatalf("flaky create: %d", st)
	}
	sb2, st, b := alice.createSandbox(nil)
	if st != http.StatusCreated {
		t.Fatalf("alice sandbox 2: %d %s", st, b)
	}
	waitFor(t, time.Minute, "the first attempt", func() bool { return len(rcv.deliveries("/flaky")) >= 1 })
	d.Crash()
	crashed := time.Now()
	d.Start()
	waitFor(t, 2*time.Minute, "the delivery after the restart", func() bool {
		ds := rcv.deliveries("/flaky")
		return len(ds) > 0 && ds[len(ds)-1].status == http.StatusNoContent
	})
	fl := rcv.deliveries("/flaky")
	last := fl[len(fl)-1]
	if !last.at.After(crashed) || len(fl) < 4 {
		t.Errorf("flaky: %d attempts, the last at %v (crash at %v)", len(fl), last.at, crashed)
	}
	for _, dl := range fl {
		if dl.headers["webhook-id"] != fl[0].headers["webhook-id"] || payloadOf(t, dl).SandboxID != sb2 {
			t.Errorf("flaky attempt: %v %s", dl.headers, dl.body)
		}
	}
	if v := verify(t, flaky.Secret, []delivery{last}); v[0] != "ok" {
		t.Errorf("verifier on the delivery after the restart: %s", v[0])
	}
	if st, b := alice.do("DELETE", "/v1/sandboxes/"+sb2, nil); st != http.StatusOK {
		t.Fatalf("terminate 2: %d %s", st, b)
	}

	// A hook whose receiver always fails is disabled after
	// webhooks.disable_after attempts in a row, and says so.
	dead, st, _ := create(admin, map[string]any{"url": rcv.url + "/dead", "events": []string{apitypes.EventSandboxCreated}})
	if st != http.StatusCreated {
		t.Fatalf("dead create: %d", st)
	}
	sb3, st, _ := admin.createSandbox(nil)
	if st != http.StatusCreated {
		t.Fatalf("admin sandbox: %d", st)
	}
	var w apitypes.Webhook
	waitFor(t, 2*time.Minute, "the dead hook disabled", func() bool {
		_, b := admin.do("GET", "/v1/webhooks/"+dead.ID, nil)
		_ = json.Unmarshal(b, &w)
		return w.State == "disabled"
	})
	if !strings.Contains(w.DisabledReason, "4 delivery attempts in a row failed") || !strings.Contains(w.DisabledReason, "HTTP 500") {
		t.Errorf("disabled reason: %q", w.DisabledReason)
	}
	if n := len(rcv.deliveries("/dead")); n != 4 {
		t.Errorf("dead receiver got %d attempts, want 4", n)
	}
	if out := d.MustCtl("audit", "export"); !strings.Contains(out, "webhook.disable") || !strings.Contains(out, dead.ID) {
		t.Errorf("no audit record of the disable")
	}
	out := d.MustCtl("webhooks", "list")
	if !strings.Contains(out, dead.ID) || !strings.Contains(out, "disabled") {
		t.Errorf("sandboxctl webhooks list:\n%s", out)
	}
	if st, b := admin.do("DELETE", "/v1/sandboxes/"+sb3, nil); st != http.StatusOK {
		t.Fatalf("terminate 3: %d %s", st, b)
	}
}
