package api

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/webui"
)

// TestUIAuthTokens checks the login token and session rules on a fake
// clock: single use, expiry, no minting without an HTTP listener.
func TestUIAuthTokens(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewUIAuth(UIAuthOptions{BaseURL: "http://127.0.0.1:7070/", LoginTTL: time.Minute, SessionTTL: time.Hour,
		Now: func() time.Time { return now }})

	l, err := a.MintLogin(principal.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if want := "http://127.0.0.1:7070/login?token=" + l.Token; l.URL != want || len(l.Token) != 64 {
		t.Fatalf("login URL %q, want %q with a 64-hex token", l.URL, want)
	}
	if !l.ExpiresAt.Equal(now.Add(time.Minute)) {
		t.Errorf("login expires at %v", l.ExpiresAt)
	}
	id, s, ok := a.redeem(l.Token)
	if !ok || id == "" || s.csrf == "" || id == s.csrf {
		t.Fatalf("redeem: ok=%v id=%q csrf=%q", ok, id, s.csrf)
	}
	if _, _, ok := a.redeem(l.Token); ok {
		t.Fatal("a login token was accepted twice")
	}
	if got, ok := a.session(id); !ok || got.csrf != s.csrf {
		t.Fatalf("session lookup: %v %+v", ok, got)
	}
	if _, ok := a.session(id + "0"); ok {
		t.Fatal("an unknown session id was accepted")
	}

	// An unused login token expires.
	late, _ := a.MintLogin(principal.Socket)
	now = now.Add(time.Minute)
	if _, _, ok := a.redeem(late.Token); ok {
		t.Fatal("an expired login token was accepted")
	}
	// Sessions expire.
	now = now.Add(time.Hour)
	if _, ok := a.session(id); ok {
		t.Fatal("an expired session was accepted")
	}

	// Logout ends a session at once.
	l2, _ := a.MintLogin(principal.Socket)
	id2, _, _ := a.redeem(l2.Token)
	a.logout(id2)
	if _, ok := a.session(id2); ok {
		t.Fatal("a session survived logout")
	}

	// No HTTP listener: no login URLs.
	_, err = NewUIAuth(UIAuthOptions{}).MintLogin(principal.Socket)
	if errdefs.CodeOf(err) != errdefs.Unavailable {
		t.Fatalf("mint without a base URL: %v, want unavailable", err)
	}
}

// routeRe finds the routes NewHandler registers, so that the check below
// covers every route, also those added later.
var routeRe = regexp.MustCompile(`mux\.Handle(?:Func)?\("(?:([A-Z]+) )?(/[^"]*)"`)

// TestWebAuthentication: without a bearer token or a session cookie, every
// route but /healthz answers 401 — JSON for the API, the login page (and no
// editor code) for everything else.
func TestWebAuthentication(t *testing.T) {
	// No request reaches the engine: a fake one serves.
	ts := newFakeTestServer(t, &fakeEngine{})
	src, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	routes := routeRe.FindAllStringSubmatch(string(src), -1)
	if len(routes) < 30 {
		t.Fatalf("found only %d routes in api.go", len(routes))
	}
	fill := strings.NewReplacer("{$}", "", "{id}", "sb-000000000000", "{name}", "python", "{job}", "job-1")
	extra := [][]string{{"", "GET", "/"}, {"", "GET", "/index.html"}, {"", "GET", "/assets/app.js"}, {"", "GET", "/assets/editor.worker.js"},
		{"", "GET", "/some/page"}, {"", "POST", "/v1/autofix"}, {"", "GET", "/login"}}
	for _, r := range append(routes, extra...) {
		method, path := r[1], fill.Replace(r[2])
		if method == "" {
			method = http.MethodGet
		}
		resp := ts.request(t, method, path, strings.NewReader("{}"), false)
		body, _ := io.ReadAll(resp.Body)
		switch {
		case path == "/healthz":
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s %s: %d, want 200", method, path, resp.StatusCode)
			}
		case isAPIPath(path):
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"unauthenticated"`) {
				t.Errorf("%s %s without credentials: %d %s, want 401 unauthenticated", method, path, resp.StatusCode, body)
			}
		default:
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `name="token"`) ||
				strings.Contains(string(body), "app.js") || strings.Contains(string(body), "monaco") {
				t.Errorf("%s %s without credentials: %d, want 401 and the login page only:\n%.300s", method, path, resp.StatusCode, body)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
				t.Errorf("%s %s: login page CSP %q", method, path, csp)
			}
		}
	}
}

// browserClient is a cookie-holding client that does not follow redirects.
type browserClient struct {
	t      *testing.T
	base   string
	cookie *http.Cookie
	csrf   string
}

func (c *browserClient) do(method, path string, hdr map[string]string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.cookie != nil {
		req.AddCookie(c.cookie)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestWebLogin: the one-time URL gives an HttpOnly SameSite=Strict session;
// the session reaches the API and the editor; state-changing requests need
// the CSRF token and a same-origin request; WebSockets need a same-origin
// Origin; a session cannot mint logins; logout ends it.
func TestWebLogin(t *testing.T) {
	// Sessions, CSRF and Origin checks are the handler's: a fake engine
	// answers the few calls that get through.
	ts := newFakeTestServer(t, &fakeEngine{})
	ctx := context.Background()
	l, err := ts.unix.MintLoginURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.URL, ts.http.URL+"/login?token=") {
		t.Fatalf("login URL %q, want one on %s", l.URL, ts.http.URL)
	}
	u, _ := url.Parse(l.URL)
	c := &browserClient{t: t, base: ts.http.URL}

	resp, _ := c.do("GET", u.RequestURI(), nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login: %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == SessionCookie {
			c.cookie = ck
		}
	}
	if c.cookie == nil || !c.cookie.HttpOnly || c.cookie.SameSite != http.SameSiteStrictMode || c.cookie.Path != "/" || c.cookie.Expires.IsZero() {
		t.Fatalf("session cookie %+v, want HttpOnly, SameSite=Strict, Path=/, an expiry", c.cookie)
	}
	// The token is single-use.
	if resp, body := (&browserClient{t: t, base: ts.http.URL}).do("GET", u.RequestURI(), nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "invalid, used or expired") {
		t.Fatalf("second use of the login URL: %d %s", resp.StatusCode, body)
	}

	// A logged-in browser at /login goes to the editor; HEAD consumes nothing.
	if resp, _ := c.do("GET", "/login", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /login with a session: %d, want 303", resp.StatusCode)
	}
	l2, err := ts.unix.MintLoginURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u2, _ := url.Parse(l2.URL)
	anon := &browserClient{t: t, base: ts.http.URL}
	if resp, _ := anon.do("HEAD", u2.RequestURI(), nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HEAD of a login URL: %d, want 401", resp.StatusCode)
	}
	if resp, _ := anon.do("GET", u2.RequestURI(), nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET of a login URL after a HEAD: %d, want 303 (HEAD must not consume it)", resp.StatusCode)
	}

	// The session reaches the API and the page.
	if resp, body := c.do("GET", "/v1/status", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/status with the session: %d %s", resp.StatusCode, body)
	}
	resp, body := c.do("GET", "/", nil)
	switch {
	case webui.Built() && (resp.StatusCode != http.StatusOK || !strings.Contains(body, "/assets/app.js")):
		t.Fatalf("GET / with the session: %d %.200s", resp.StatusCode, body)
	case !webui.Built() && resp.StatusCode != http.StatusServiceUnavailable:
		t.Fatalf("GET / without a bundle: %d", resp.StatusCode)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("editor headers: CSP %q, X-Frame-Options %q", csp, resp.Header.Get("X-Frame-Options"))
	}
	if webui.Built() {
		// Assets go gzipped to clients that take it, plain to the others.
		zr, zbody := c.do("GET", "/assets/app.js", map[string]string{"Accept-Encoding": "gzip, deflate"})
		pr, pbody := c.do("GET", "/assets/app.js", map[string]string{"Accept-Encoding": "identity"})
		if zr.Header.Get("Content-Encoding") != "gzip" || pr.Header.Get("Content-Encoding") != "" ||
			!strings.HasPrefix(zr.Header.Get("Content-Type"), "text/javascript") || !strings.HasPrefix(pr.Header.Get("Content-Type"), "text/javascript") {
			t.Errorf("app.js: gzip %q %q, plain %q %q", zr.Header.Get("Content-Encoding"), zr.Header.Get("Content-Type"), pr.Header.Get("Content-Encoding"), pr.Header.Get("Content-Type"))
		}
		unz, err := gzip.NewReader(strings.NewReader(zbody))
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(unz); string(b) != pbody || len(pbody) < 100000 {
			t.Errorf("gunzipped app.js (%d bytes) differs from the plain one (%d bytes)", len(b), len(pbody))
		}
	}
	resp, body = c.do("GET", "/v1/ui/session", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/ui/session: %d %s", resp.StatusCode, body)
	}
	c.csrf = regexp.MustCompile(`"csrf_token":"([0-9a-f]+)"`).FindStringSubmatch(body)[1]
	sys := struct{ body string }{}
	_, sys.body = c.do("GET", "/v1/system", nil)
	if !strings.Contains(sys.body, `"autofix":true`) || !strings.Contains(sys.body, `"terminal":true`) {
		t.Errorf("GET /v1/system: %s", sys.body)
	}

	// The page claims only / and /assets/: other paths keep the mux's 404
	// and 405 answers.
	if resp, _ := c.do("GET", "/some/page", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /some/page with the session: %d, want 404", resp.StatusCode)
	}
	if resp, _ := c.do("DELETE", "/v1/status", map[string]string{CSRFHeader: c.csrf}); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /v1/status with the session: %d, want 405", resp.StatusCode)
	}

	// State-changing requests: CSRF token and same origin required.
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"no CSRF token", map[string]string{}, http.StatusForbidden},
		{"wrong CSRF token", map[string]string{CSRFHeader: strings.Repeat("0", 64)}, http.StatusForbidden},
		{"foreign Origin", map[string]string{CSRFHeader: c.csrf, "Origin": "http://evil.example"}, http.StatusForbidden},
		{"cross-site fetch", map[string]string{CSRFHeader: c.csrf, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"same origin", map[string]string{CSRFHeader: c.csrf, "Origin": ts.http.URL, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
	} {
		resp, body := c.do("POST", "/v1/gc", tc.hdr)
		if resp.StatusCode != tc.want {
			t.Errorf("POST /v1/gc, %s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.want)
		}
		if tc.want == http.StatusForbidden && !strings.Contains(body, `"permission_denied"`) {
			t.Errorf("POST /v1/gc, %s: body %s", tc.name, body)
		}
	}
	// A session cannot mint login URLs (it would outlive its expiry).
	if resp, body := c.do("POST", "/v1/ui/login-tokens", map[string]string{CSRFHeader: c.csrf}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("mint with a session: %d %s", resp.StatusCode, body)
	}

	// WebSockets: the Origin must be the daemon's own.
	dial := func(hdr http.Header) (int, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(dctx, strings.Replace(ts.http.URL, "http", "ws", 1)+"/v1/events", &websocket.DialOptions{HTTPHeader: hdr})
		if conn != nil {
			conn.CloseNow()
		}
		if resp == nil {
			return 0, err
		}
		return resp.StatusCode, err
	}
	cookieHdr := func(origin string) http.Header {
		h := http.Header{"Cookie": {c.cookie.Name + "=" + c.cookie.Value}}
		if origin != "" {
			h.Set("Origin", origin)
		}
		return h
	}
	if code, err := dial(cookieHdr("http://evil.example")); code != http.StatusForbidden {
		t.Errorf("WebSocket with the session from a foreign Origin: %d %v, want 403", code, err)
	}
	if code, err := dial(cookieHdr("")); code != http.StatusForbidden {
		t.Errorf("WebSocket with the session and no Origin: %d %v, want 403", code, err)
	}
	if code, err := dial(cookieHdr(ts.http.URL)); code != http.StatusSwitchingProtocols || err != nil {
		t.Errorf("WebSocket with the session from the daemon's Origin: %d %v, want 101", code, err)
	}
	if code, err := dial(http.Header{"Authorization": {"Bearer " + testToken}, "Origin": {"http://evil.example"}}); code != http.StatusForbidden {
		t.Errorf("WebSocket with the bearer token from a foreign Origin: %d %v, want 403", code, err)
	}
	if code, err := dial(http.Header{"Origin": {ts.http.URL}}); code != http.StatusUnauthorized {
		t.Errorf("WebSocket without credentials: %d %v, want 401", code, err)
	}

	// Logout ends the session.
	if resp, body := c.do("POST", "/v1/ui/logout", map[string]string{CSRFHeader: c.csrf, "Origin": ts.http.URL}); resp.StatusCode != http.StatusOK {
		t.Fatalf("logout: %d %s", resp.StatusCode, body)
	}
	if resp, _ := c.do("GET", "/v1/status", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/status after logout: %d, want 401", resp.StatusCode)
	}

	// The login form: refused cross-site, accepted from the login page.
	form := func(origin string) *http.Response {
		l, err := ts.unix.MintLoginURL(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", ts.http.URL+"/login", strings.NewReader(url.Values{"token": {l.Token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := form("http://evil.example"); resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Errorf("cross-site login form: %d, cookies %v; want 403 and none", resp.StatusCode, resp.Cookies())
	}
	if resp := form(ts.http.URL); resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Errorf("same-origin login form: %d, cookies %v; want 303 and a session", resp.StatusCode, resp.Cookies())
	}
}
