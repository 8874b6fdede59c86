package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/webui"
)

// rest sends one REST request with a bearer key; it returns the status and
// the body.
func rest(t *testing.T, d *testenv.Daemon, key, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+d.HTTPAddr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil && method != http.MethodPut {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// keyLogin mints a login URL for key over HTTP, as `sandboxctl --url ...
// --token KEY ui` does: the browser session it opens acts as that key.
func keyLogin(t *testing.T, d *testenv.Daemon, key string) string {
	t.Helper()
	st, b := rest(t, d, key, "POST", "/v1/ui/login-tokens", nil)
	var l struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(b, &l); st != http.StatusCreated || err != nil || !loginURLRe.MatchString(l.URL+"\n") {
		t.Fatalf("mint a login for a key: %d %s", st, b)
	}
	return l.URL
}

// sessionProbe is JavaScript run in the editor's page: the calls the
// editor makes for a sandbox (the session cookie, and the CSRF header
// the page reads from /v1/ui/session for writes), each answered with its
// status and error code and message.
const sessionProbe = `(async (id) => {
  const csrf = (await (await fetch("/v1/ui/session")).json()).csrf_token;
  const call = async (method, path, body) => {
    const r = await fetch(path, {method, body, headers: method === "GET" ? {} : {"X-CSRF-Token": csrf, "Content-Type": "application/json"}});
    let e = {};
    try { e = (await r.json()).error || {}; } catch (_) {}
    return {status: r.status, code: e.code || "", message: e.message || ""};
  };
  const list = await (await fetch("/v1/sandboxes")).json();
  return {
    list: (list.sandboxes || []).map(s => s.sandbox_id + "/" + (s.tenant || "")),
    get: await call("GET", "/v1/sandboxes/" + id),
    read: await call("GET", "/v1/sandboxes/" + id + "/files?path=/workspace/secret.txt"),
    ls: await call("GET", "/v1/sandboxes/" + id + "/files?path=/workspace&list=true"),
    write: await call("PUT", "/v1/sandboxes/" + id + "/files?path=/workspace/stolen.txt", "stolen"),
    exec: await call("POST", "/v1/sandboxes/" + id + "/exec", JSON.stringify({command: "cat /workspace/secret.txt"})),
    ports: await call("GET", "/v1/sandboxes/" + id + "/ports"),
    expose: await call("POST", "/v1/sandboxes/" + id + "/ports", JSON.stringify({port: 8080})),
  };
})`

type probeAnswer struct {
	Status        int
	Code, Message string
}

type probeResult struct {
	List                                      []string
	Get, Read, Ls, Write, Exec, Ports, Expose probeAnswer
}

// openTerminal opens a terminal WebSocket from the page to sandbox id and
// records what happens to it in window.term (opened, output, close code).
func openTerminal(id string) string {
	return fmt.Sprintf(`(() => {
  window.term = {opened: false, out: "", closed: 0};
  const ws = new WebSocket("ws://" + location.host + "/v1/sandboxes/%s/terminal?cmd=sh");
  ws.binaryType = "arraybuffer";
  ws.onopen = () => { term.opened = true; };
  ws.onmessage = (m) => { term.out += typeof m.data === "string" ? m.data : new TextDecoder().decode(m.data); };
  ws.onclose = (e) => { term.closed = e.code || 1; };
  window.termSend = (s) => ws.send(new TextEncoder().encode(s));
  return true;
})()`, id)
}

// TestBrowserTenants: two user keys and the administrator's, each logged
// in to the web editor in Chromium through a login URL minted for the key.
// Bob's session cannot list, get, read, list files of, write, exec in,
// open a terminal to, list or make the preview exposures of alice's
// sandbox — each answered not_found with the words of a sandbox that does
// not exist — and the preview itself refuses a browser without the
// exposure's token; the admin's editor lists both sandboxes with their
// tenants. Then alice's key is revoked while her editor session, a
// terminal WebSocket from that page and her preview exposure are open:
// the session's next request is 401, the terminal is closed (1008,
// policy violation) on its next message without running it, and the
// preview refuses her token.
func TestBrowserTenants(t *testing.T) {
	testenv.RequireRoot(t)
	if !webui.Built() {
		t.Fatal("the web bundle is not built into this test binary: run make build")
	}
	d := testenv.NewDaemon(t)
	d.Start()
	key := func(name string) (id, secret string) {
		var k apitypes.KeySecret
		if err := json.Unmarshal([]byte(d.MustCtl("--json", "keys", "create", name)), &k); err != nil || k.Secret == "" {
			t.Fatalf("keys create %s: %+v %v", name, k, err)
		}
		return k.ID, k.Secret
	}
	aliceID, aliceKey := key("alice")
	_, bobKey := key("bob")
	create := func(key string) string {
		st, b := rest(t, d, key, "POST", "/v1/sandboxes", []byte(`{"language":"shell"}`))
		var sb apitypes.Sandbox
		if err := json.Unmarshal(b, &sb); st != http.StatusCreated || err != nil {
			t.Fatalf("create: %d %s", st, b)
		}
		return sb.ID
	}
	a, bsb := create(aliceKey), create(bobKey)
	if st, b := rest(t, d, aliceKey, "PUT", "/v1/sandboxes/"+a+"/files?path=/workspace/secret.txt", []byte("alice's secret")); st >= 300 {
		t.Fatalf("alice writes her file: %d %s", st, b)
	}
	st, body := rest(t, d, aliceKey, "POST", "/v1/sandboxes/"+a+"/ports", []byte(`{"port":8080}`))
	var x apitypes.PortExposure
	if err := json.Unmarshal(body, &x); st >= 300 || err != nil || x.Token == "" {
		t.Fatalf("alice exposes 8080: %d %s", st, body)
	}

	b := newBrowser(t)

	// Bob, in the editor.
	b.Do("bob logs in", chromedp.Navigate(keyLogin(t, d, bobKey)))
	b.WaitFor("bob's editor", `document.body.dataset.ready === "1"`, 30*time.Second)
	b.WaitFor("bob's sandbox in his list", `document.querySelector('#sandbox-list li[data-id="`+bsb+`"] .tenant')?.textContent === "bob"`, 15*time.Second)
	if Eval[bool](b, `document.querySelector('#sandbox-list li[data-id="`+a+`"]') !== null`) {
		t.Errorf("bob's editor lists alice's sandbox %s", a)
	}
	b.Screenshot("tenants-bob")
	const missing = "sb-0123456789ab"
	absent := Eval[probeResult](b, sessionProbe+`("`+missing+`")`)
	got := Eval[probeResult](b, sessionProbe+`("`+a+`")`)
	if len(got.List) != 1 || got.List[0] != bsb+"/bob" {
		t.Errorf("bob's session lists %v, want only his %s", got.List, bsb)
	}
	for name, pair := range map[string][2]probeAnswer{
		"get": {got.Get, absent.Get}, "read": {got.Read, absent.Read}, "list files": {got.Ls, absent.Ls},
		"write": {got.Write, absent.Write}, "exec": {got.Exec, absent.Exec}, "list ports": {got.Ports, absent.Ports},
		"expose": {got.Expose, absent.Expose},
	} {
		g, m := pair[0], pair[1]
		if g.Status != http.StatusNotFound || g.Code != "not_found" || strings.ReplaceAll(g.Message, a, missing) != m.Message || m.Code != "not_found" {
			t.Errorf("bob's %s of alice's sandbox: %+v; of a missing one: %+v (want the same not_found)", name, g, m)
		}
	}
	// A terminal to alice's sandbox from bob's page: refused at the
	// upgrade (a browser sees only that it closed; the daemon says 404).
	Eval[bool](b, openTerminal(a))
	b.WaitFor("bob's terminal to alice's sandbox to close", `window.term.closed !== 0`, 15*time.Second)
	if Eval[bool](b, `window.term.opened`) {
		t.Errorf("bob's page opened a terminal to alice's sandbox")
	}
	if log, _ := os.ReadFile(d.LogPath); !strings.Contains(string(log), "path=/v1/sandboxes/"+a+"/terminal status=404") {
		t.Errorf("the daemon log shows no 404 for bob's terminal to %s", a)
	}
	// The preview of alice's port, without its token (bob's session cannot
	// learn it: listing and exposing her ports are not_found above).
	b.Do("bob opens alice's preview", chromedp.Navigate(x.BaseURL))
	b.WaitFor("the preview's refusal", `document.body.textContent.includes("unauthenticated")`, 15*time.Second)
	if st, b := rest(t, d, aliceKey, "GET", "/v1/sandboxes/"+a+"/files?path=/workspace/stolen.txt", nil); st != http.StatusNotFound {
		t.Errorf("bob's write reached alice's sandbox: %d %s", st, b)
	}

	// The administrator sees both, with their tenants.
	b.Do("the admin logs in", chromedp.Navigate(keyLogin(t, d, d.Token())))
	b.WaitFor("the admin's editor", `document.body.dataset.ready === "1"`, 30*time.Second)
	b.WaitFor("both sandboxes with their tenants", `document.querySelector('#sandbox-list li[data-id="`+a+`"] .tenant')?.textContent === "alice" && document.querySelector('#sandbox-list li[data-id="`+bsb+`"] .tenant')?.textContent === "bob"`, 15*time.Second)
	b.Screenshot("tenants-admin")
	if adm := Eval[probeResult](b, sessionProbe+`("`+a+`")`); adm.Get.Status != http.StatusOK || adm.Read.Status != http.StatusOK {
		t.Errorf("the admin's session on alice's sandbox: get %+v, read %+v", adm.Get, adm.Read)
	}

	// Alice, then her key revoked under her open session, terminal and
	// preview exposure.
	b.Do("alice logs in", chromedp.Navigate(keyLogin(t, d, aliceKey)))
	b.WaitFor("alice's editor", `document.body.dataset.ready === "1"`, 30*time.Second)
	if mine := Eval[probeResult](b, sessionProbe+`("`+a+`")`); mine.Read.Status != http.StatusOK || mine.Get.Status != http.StatusOK {
		t.Fatalf("alice's session on her sandbox: get %+v, read %+v", mine.Get, mine.Read)
	}
	Eval[bool](b, openTerminal(a))
	b.WaitFor("alice's terminal to open", `window.term.opened`, 15*time.Second)
	Eval[bool](b, `(termSend("echo before-$((6*7))\n"), true)`)
	b.WaitFor("alice's terminal to answer", `window.term.out.includes("before-42")`, 15*time.Second)
	previewStatus := func() int {
		req, _ := http.NewRequest("GET", x.BaseURL, nil)
		req.Header.Set(x.TokenHeader, x.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := previewStatus(); st != http.StatusBadGateway {
		t.Fatalf("alice's preview before revoke: %d, want 502 (authorized and relayed; nothing listens)", st)
	}

	d.MustCtl("keys", "revoke", aliceID)

	if st := Eval[int](b, `fetch("/v1/sandboxes").then(r => r.status)`); st != http.StatusUnauthorized {
		t.Errorf("alice's web session after revoke: %d, want 401", st)
	}
	Eval[bool](b, `(termSend("echo after-$((6*7))\n"), true)`)
	b.WaitFor("alice's terminal to be closed", `window.term.closed !== 0`, 15*time.Second)
	if code := Eval[int](b, `window.term.closed`); code != 1008 {
		t.Errorf("alice's terminal closed with %d, want 1008 (policy violation)", code)
	}
	if Eval[bool](b, `window.term.out.includes("after-42")`) {
		t.Error("alice's terminal ran a command after her key was revoked")
	}
	if st := previewStatus(); st != http.StatusUnauthorized {
		t.Errorf("alice's preview after revoke: %d, want 401", st)
	}
	b.Screenshot("tenants-alice-revoked")
	if st, b := rest(t, d, d.Token(), "DELETE", "/v1/sandboxes/"+a, nil); st != http.StatusOK {
		t.Errorf("admin terminates alice's: %d %s", st, b)
	}
	if st, b := rest(t, d, bobKey, "DELETE", "/v1/sandboxes/"+bsb, nil); st != http.StatusOK {
		t.Errorf("bob terminates his: %d %s", st, b)
	}
}
