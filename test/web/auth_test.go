package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/webui"
)

// TestBrowserAuth: a browser without a session sees only the login page;
// once logged in, pages of other origins — same-site (127.0.0.1 on another
// port, where the SameSite=Strict cookie IS sent) and cross-site
// (localhost) — can neither change state with the user's cookie nor open a
// WebSocket to the daemon.
func TestBrowserAuth(t *testing.T) {
	testenv.RequireRoot(t)
	if !webui.Built() {
		t.Fatal("the web bundle is not built into this test binary: run make build")
	}
	plain, gz := bundleSize(webui.Files())
	t.Logf("FIGURE bundle size: %.2f MiB as built, %.2f MiB gzipped as served", float64(plain)/(1<<20), float64(gz)/(1<<20))
	d := testenv.NewDaemon(t)
	d.Start()
	b := newBrowser(t)
	base := "http://" + d.HTTPAddr

	// Not logged in: the login page, for the editor and for its code.
	for _, p := range []string{"/", "/assets/app.js", "/index.html"} {
		b.Do("open "+p, chromedp.Navigate(base+p))
		b.WaitFor("the login page at "+p, `document.querySelector('form[action="/login"] input[name="token"]') !== null`, 10*time.Second)
		if Eval[bool](b, `document.getElementById("toolbar") !== null || performance.getEntriesByType("resource").some(e => e.name.includes("/assets/"))`) {
			t.Errorf("%s: editor code reached a browser without a session", p)
		}
	}
	b.Screenshot("login-page")
	// A wrong token: still the login page, with the reason.
	b.Do("a wrong token", chromedp.Navigate(base+"/login?token="+strings.Repeat("ab", 32)))
	b.WaitFor("the login error", `document.getElementById("login-error")?.textContent.includes("invalid")`, 10*time.Second)

	// Log in, then visit the other origins in the same browser.
	b.Do("log in", chromedp.Navigate(loginURL(t, d)))
	b.WaitFor("the editor", `document.body.dataset.ready === "1"`, 30*time.Second)

	// First load on loopback: empty cache, the browser already running.
	var loads []time.Duration
	for range 3 {
		b.Do("clear the cache", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, network.ClearBrowserCache, cdp.Empty{})
			return err
		}))
		start := time.Now()
		b.Do("load the editor", chromedp.Navigate(base+"/"))
		b.WaitFor("the editor", `document.body.dataset.ready === "1"`, 30*time.Second)
		loads = append(loads, time.Since(start))
	}
	slices.Sort(loads)
	wire := Eval[float64](b, `performance.getEntriesByType("resource").filter(e => e.name.includes("/assets/")).reduce((s, e) => s + e.transferSize, 0)`)
	t.Logf("FIGURE first load, empty cache, loopback: median of 3 %v (min %v, max %v), %.2f MiB of assets on the wire",
		loads[1].Round(time.Millisecond), loads[0].Round(time.Millisecond), loads[2].Round(time.Millisecond), wire/(1<<20))

	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><body><form id="f" method="post" action="%s/v1/sandboxes" enctype="text/plain" target="sink">
<input name='{"language":"shell","x":"' value='"}'></form><iframe name="sink"></iframe><script>
window.results = {};
fetch(%q + "/v1/sandboxes", {method: "POST", mode: "no-cors", credentials: "include", body: '{"language":"shell"}'})
  .then(() => results.fetch = "sent", e => results.fetch = "error " + e);
const ws = new WebSocket(%q + "/v1/events");
ws.onopen = () => results.ws = "open";
ws.onerror = () => results.ws = results.ws || "refused";
ws.onclose = () => results.ws = results.ws || "refused";
document.getElementById("f").submit();
setTimeout(() => results.done = true, 1500);
</script></body>`, base, base, strings.Replace(base, "http", "ws", 1))
	}))
	defer evil.Close()
	port := evil.URL[strings.LastIndex(evil.URL, ":")+1:]
	for _, origin := range []string{"http://127.0.0.1:" + port, "http://localhost:" + port} {
		b.Do("open "+origin, chromedp.Navigate(origin+"/"))
		b.WaitFor("the attack page to finish", `window.results && window.results.done && window.results.ws`, 15*time.Second)
		if ws := Eval[string](b, `window.results.ws`); ws != "refused" {
			t.Errorf("WebSocket from %s: %s, want refused", origin, ws)
		}
	}
	// None of the cross-origin POSTs created a sandbox.
	req, _ := http.NewRequest("GET", base+"/v1/sandboxes?state=all", nil)
	req.Header.Set("Authorization", "Bearer "+d.Token())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil || res.StatusCode != 200 {
		t.Fatalf("list sandboxes: %d %v", res.StatusCode, err)
	}
	if len(list.Sandboxes) != 0 {
		t.Fatalf("cross-origin POSTs created %d sandboxes", len(list.Sandboxes))
	}
	// The daemon refused them itself (403), not only the browser.
	log, _ := os.ReadFile(d.LogPath)
	if !strings.Contains(string(log), `method=POST path=/v1/sandboxes status=403`) {
		t.Errorf("the daemon log shows no refused POST /v1/sandboxes:\n%s", d.Log())
	}
}
