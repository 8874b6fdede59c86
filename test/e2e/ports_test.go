package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// previewServer is a Python (stdlib only) HTTP server with a WebSocket echo
// endpoint: GET /hello answers with the request's path, query, token header
// and cookies, so the test sees what reached the sandbox; GET /ws upgrades
// and echoes text frames upper-cased.
const previewServer = `
import base64, hashlib, http.server, json, struct, sys

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.ws()
        body = json.dumps({"path": self.path, "cookie": self.headers.get("Cookie", ""),
            "token_header": self.headers.get("X-Sandboxd-Preview-Token", ""),
            "prefix": self.headers.get("X-Forwarded-Prefix", ""), "msg": "hello from the sandbox"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def ws(self):
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            h = r.read(2)
            if len(h) < 2: return
            op, n = h[0] & 15, h[1] & 127
            if n == 126: n = struct.unpack(">H", r.read(2))[0]
            elif n == 127: n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                w.write(b"\x88\x02" + data[:2]); w.flush(); return
            if op == 1:
                out = data.upper()
                w.write(bytes([0x81, len(out)]) + out); w.flush()

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// TestPreviewPort exposes a port of a sandbox without network: the
// server inside is reached through the preview listener with the
// exposure's token (header, and the browser's URL-then-cookie flow), and
// refused without it; a WebSocket works through it; bad input is refused
// with the field named; the exposure survives a daemon restart and is gone
// after terminate.
func TestPreviewPort(t *testing.T) {
	d := testenv.NewDaemon(t, "python")
	d.Start()
	id := strings.TrimSpace(d.MustCtl("create", "--lang", "python", "--network", "none"))
	if !idRe.MatchString(id) {
		t.Fatalf("create printed %q", id)
	}
	d.MustCtl("exec", "-d", id, "--", "python3", "-c", previewServer, "8000")

	var x apitypes.PortExposure
	if err := json.Unmarshal([]byte(d.MustCtl("port", "--json", id, "8000")), &x); err != nil {
		t.Fatal(err)
	}
	if x.SandboxID != id || x.Port != 8000 || x.Token == "" || !strings.HasSuffix(x.BaseURL, "/preview/"+id+"/8000/") ||
		x.URL != x.BaseURL+"?"+apitypes.PreviewTokenParam+"="+x.Token || x.TokenHeader != apitypes.PreviewTokenHeader {
		t.Fatalf("exposure %+v", x)
	}
	// Exposing again answers the same exposure.
	if again := strings.TrimSpace(d.MustCtl("port", id, "8000")); again != x.URL {
		t.Errorf("second expose printed %q, want %q", again, x.URL)
	}
	if list := d.MustCtl("port", id); !strings.Contains(list, "8000\t"+x.URL) {
		t.Errorf("port list: %q", list)
	}

	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(c *http.Client, u string, hdr map[string]string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	hello := x.BaseURL + "hello?a=1"

	// Without a token, or with another one: 401, and nothing reaches the sandbox.
	if code, body, _ := get(noRedirect, hello, nil); code != http.StatusUnauthorized || !strings.Contains(body, "unauthenticated") {
		t.Errorf("no token: %d %s", code, body)
	}
	if code, _, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: strings.Repeat("0", len(x.Token))}); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	if code, _, _ := get(noRedirect, strings.Replace(hello, "/8000/", "/8001/", 1), map[string]string{x.TokenHeader: x.Token}); code != http.StatusUnauthorized {
		t.Errorf("token of another port: %d", code)
	}

	// The header form: the server may take a moment to listen.
	var seen struct{ Path, Cookie, Token_header, Prefix, Msg string }
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, body, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: x.Token})
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &seen); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			break
		}
		if code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("with the token header: %d %s", code, body)
		}
	}
	if seen.Msg != "hello from the sandbox" || seen.Path != "/hello?a=1" || seen.Token_header != "" || seen.Prefix != "/preview/"+id+"/8000" {
		t.Errorf("the sandbox saw %+v", seen)
	}

	// The host-name form (an origin per exposure): the app is served at
	// "/", without a prefix. Browsers resolve *.localhost to the loopback;
	// here the request goes to the listener's address with that Host.
	hu, err := url.Parse(x.HostURL)
	if err != nil || hu.Hostname() != "p8000-"+id+".localhost" {
		t.Fatalf("host_url %q", x.HostURL)
	}
	{
		req, _ := http.NewRequest(http.MethodGet, x.BaseURL, nil)
		req.URL.Path = "/hello"
		req.Host = hu.Host
		req.Header.Set(x.TokenHeader, x.Token)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"path": "/hello"`) || !strings.Contains(string(b), `"prefix": ""`) {
			t.Errorf("host-name form: %d %s", resp.StatusCode, b)
		}
	}

	// The browser form: the URL with the token sets a cookie and redirects
	// to the URL without it; the cookie then opens pages, and the
	// application never sees it.
	code, _, hdr := get(noRedirect, x.URL, nil)
	if code != http.StatusSeeOther || hdr.Get("Location") != "/preview/"+id+"/8000/" || !strings.Contains(hdr.Get("Set-Cookie"), "HttpOnly") {
		t.Fatalf("token URL: %d, Location %q, Set-Cookie %q", code, hdr.Get("Location"), hdr.Get("Set-Cookie"))
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Timeout: 10 * time.Second, Jar: jar}
	code, body, _ := get(browser, x.URL, nil)
	if code != http.StatusOK || !strings.Contains(body, `"path": "/"`) {
		t.Fatalf("browser after redirect: %d %s", code, body)
	}
	u, _ := url.Parse(x.BaseURL)
	jar.SetCookies(u, []*http.Cookie{{Name: "app", Value: "kept"}})
	if code, body, _ := get(browser, hello, nil); code != http.StatusOK || !strings.Contains(body, `"cookie": "app=kept"`) {
		t.Errorf("browser with cookie: %d %s", code, body)
	}

	// WebSocket through the relay, with the header token.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(x.BaseURL, "http") + "ws"
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{x.TokenHeader: {x.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"ping", "through the agent"} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		typ, got, err := ws.Read(ctx)
		if err != nil || typ != websocket.MessageText || string(got) != strings.ToUpper(msg) {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	// Without a token the upgrade is refused; with the cookie from a
	// foreign page's Origin too.
	if _, resp, err := websocket.Dial(ctx, wsURL, nil); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("WebSocket without token: %v %v", resp, err)
	}
	cookieHdr := http.Header{"Origin": {"http://evil.example"}}
	for _, c := range jar.Cookies(u) {
		cookieHdr.Add("Cookie", c.String())
	}
	if _, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: cookieHdr}); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("WebSocket with cookie from a foreign origin: %v %v", resp, err)
	}

	// Bad input names its field.
	for _, tc := range []struct{ args, want string }{
		{"port " + id + " 70000", "port: 70000 is not in 1-65535"},
		{"port " + id + " 0", "port: 0 is not in 1-65535"},
		{"port sb-000000000000 8000", "sandbox_id: no sandbox"},
		{"port " + id + " 9999 --unexpose", "port: port 9999 of sandbox " + id + " is not exposed"},
	} {
		_, stderr, code := d.Ctl(strings.Fields(tc.args)...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("sandboxctl %s: exit %d, stderr %q; want %q", tc.args, code, stderr, tc.want)
		}
	}

	// Unexpose ends the token at once; expose again gives a new one.
	d.MustCtl("port", id, "8000", "--unexpose")
	if code, _, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: x.Token}); code != http.StatusUnauthorized {
		t.Errorf("after unexpose: %d", code)
	}
	if err := json.Unmarshal([]byte(d.MustCtl("port", "--json", id, "8000")), &x); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: x.Token}); code != http.StatusOK {
		t.Errorf("exposed again: %d", code)
	}

	// The exposure survives a daemon restart with its sandbox: the same
	// token, at the restarted listener's address (a free port each start).
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Start()
	var after []apitypes.PortExposure
	if err := json.Unmarshal([]byte(d.MustCtl("port", "--json", id)), &after); err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || after[0].Token != x.Token || after[0].Port != 8000 {
		t.Fatalf("exposures after restart: %+v, want port 8000 with token %s", after, x.Token)
	}
	x = after[0]
	hello = x.BaseURL + "hello?a=1"
	if code, body, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: x.Token}); code != http.StatusOK || !strings.Contains(body, "hello from the sandbox") {
		t.Errorf("after restart: %d %s", code, body)
	}

	// Terminate ends the exposure.
	d.MustCtl("rm", "-f", id)
	if code, _, _ := get(noRedirect, hello, map[string]string{x.TokenHeader: x.Token}); code != http.StatusUnauthorized {
		t.Errorf("after terminate: %d", code)
	}
	if list := strings.TrimSpace(d.MustCtl("port", "--json", id)); list != "[]" {
		t.Errorf("ports after terminate: %s", list)
	}
	if _, stderr, code := d.Ctl("port", id, "8000"); code == 0 || !strings.Contains(stderr, "sandbox_id: sandbox "+id+" is terminated") {
		t.Errorf("expose on a terminated sandbox: exit %d %q", code, stderr)
	}
}
