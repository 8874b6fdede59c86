package preview

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// fakeEngine exposes port 8000 of sb-1 with token "tok", served by a local
// HTTP server standing in for the sandbox (the relay through the agent is
// tested in pkg/agent and test/e2e).
type fakeEngine struct{ app string }

func (f *fakeEngine) AuthorizePreview(id string, port int, token string) error {
	if id == "sb-1" && port == 8000 && token == "tok" {
		return nil
	}
	return errdefs.Unauthenticatedf("preview: a valid token for this port is required")
}

func (f *fakeEngine) DialExposed(ctx context.Context, id string, port int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.app)
}

func TestHandler(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.RequestURI()+"|"+r.Header.Get("Cookie")+"|"+r.Header.Get(apitypes.PreviewTokenHeader)+"|"+r.Header.Get("X-Forwarded-Prefix")+"|"+r.Host)
	}))
	defer app.Close()
	h := NewHandler(&fakeEngine{app: app.Listener.Addr().String()}, nil)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// hostForm sends GET path with Host host (the host-name form), do
	// with the server's own.
	hostForm := func(host, path string, hdr http.Header) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	do := func(path string, hdr http.Header) (int, string, http.Header) {
		t.Helper()
		return hostForm("", path, hdr)
	}
	tok := http.Header{apitypes.PreviewTokenHeader: {"tok"}}
	for _, tc := range []struct {
		path string
		hdr  http.Header
		code int
		body string
	}{
		{"/preview/sb-1/8000/a/b?x=1", tok, 200, "/a/b?x=1||" + "|/preview/sb-1/8000|" + host},
		{"/preview/sb-1/8000/?sandboxd_preview_token=tok&y=2", tok, 200, "/?y=2|||/preview/sb-1/8000|" + host},
		{"/preview/sb-1/8000/a", http.Header{"Cookie": {"app=1; sandboxd_preview=tok; other=2"}}, 200, "/a|app=1; other=2||/preview/sb-1/8000|" + host},
		{"/preview/sb-1/8000/a", nil, 401, "unauthenticated"},
		{"/preview/sb-1/8000/a", http.Header{apitypes.PreviewTokenHeader: {"nope"}}, 401, "unauthenticated"},
		{"/preview/sb-1/8001/a", tok, 401, "unauthenticated"},
		{"/preview/sb-2/8000/a", tok, 401, "unauthenticated"},
		{"/preview/sb-1/08000/a", tok, 404, "not_found"},
		{"/preview/sb-1/70000/", tok, 404, "not_found"},
		{"/preview/sb-1", tok, 404, "not_found"},
		{"/elsewhere", tok, 404, "not_found"},
		{"/preview/sb-1/8000", tok, 301, ""},
	} {
		code, body, _ := do(tc.path, tc.hdr)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET %s: %d %q; want %d %q", tc.path, code, body, tc.code, tc.body)
		}
	}

	// The browser flow: token in the URL → cookie scoped to the exposure,
	// 303 to the URL without the token.
	code, _, hdr := do("/preview/sb-1/8000/page?sandboxd_preview_token=tok&q=1", nil)
	c := hdr.Get("Set-Cookie")
	if code != http.StatusSeeOther || hdr.Get("Location") != "/preview/sb-1/8000/page?q=1" ||
		!strings.Contains(c, "sandboxd_preview=tok") || !strings.Contains(c, "Path=/preview/sb-1/8000/") ||
		!strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Lax") {
		t.Errorf("token URL: %d Location %q Set-Cookie %q", code, hdr.Get("Location"), c)
	}

	// The host-name form: the whole path goes to the application, no
	// prefix; the cookie is the host's (Path=/).
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	named := "p8000-sb-1.localhost:" + strconv.Itoa(port)
	if code, body, _ := hostForm(named, "/a/b?x=1", tok); code != 200 || body != "/a/b?x=1||||"+named {
		t.Errorf("host form: %d %q", code, body)
	}
	if code, _, _ := hostForm("p8001-sb-1.localhost", "/", tok); code != 401 {
		t.Errorf("host form, token of another port: %d", code)
	}
	for _, bad := range []string{"p08000-sb-1.localhost", "x8000-sb-1.localhost", "p8000-sb-1.example", "p8000.sb-1.localhost"} {
		if code, _, _ := hostForm(bad, "/a", tok); code != 404 {
			t.Errorf("host %s: %d, want 404 (not an exposure's name, no /preview/ path)", bad, code)
		}
	}
	code, _, hdr = hostForm(named, "/?sandboxd_preview_token=tok", nil)
	if c := hdr.Get("Set-Cookie"); code != http.StatusSeeOther || hdr.Get("Location") != "/" || !strings.Contains(c, "Path=/;") && !strings.HasSuffix(c, "Path=/") {
		t.Errorf("host form token URL: %d Location %q Set-Cookie %q", code, hdr.Get("Location"), c)
	}

	// A cookie-borne WebSocket upgrade from a foreign page is refused; the
	// same with the header token, or from the listener's own origin, passes
	// the check (the fake app then answers the upgrade with 200).
	ws := func(extra http.Header) int {
		h := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
		for k, v := range extra {
			h[k] = v
		}
		code, _, _ := do("/preview/sb-1/8000/ws", h)
		return code
	}
	cookie := http.Header{"Cookie": {"sandboxd_preview=tok"}}
	if code := ws(http.Header{"Cookie": cookie["Cookie"], "Origin": {"http://evil.example"}}); code != http.StatusForbidden {
		t.Errorf("foreign-origin WebSocket with the cookie: %d", code)
	}
	if code := ws(http.Header{"Cookie": cookie["Cookie"], "Origin": {(&url.URL{Scheme: "http", Host: host}).String()}}); code == http.StatusForbidden || code == http.StatusUnauthorized {
		t.Errorf("same-origin WebSocket with the cookie: %d", code)
	}
	if code := ws(http.Header{apitypes.PreviewTokenHeader: {"tok"}, "Origin": {"http://evil.example"}}); code == http.StatusForbidden || code == http.StatusUnauthorized {
		t.Errorf("WebSocket with the header token: %d", code)
	}
}
