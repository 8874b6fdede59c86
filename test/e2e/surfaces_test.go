package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// rssBytes reads a process's resident set size.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// bigMCPBody streams a tools/call request of about n bytes without holding it.
func bigMCPBody(n int64) io.Reader {
	head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"command":"`
	tail := `"}}}`
	pad := io.LimitReader(repeatByte('a'), n-int64(len(head)+len(tail)))
	return io.MultiReader(strings.NewReader(head), pad, strings.NewReader(tail))
}

type repeatByte byte

func (b repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// errorCode decodes the taxonomy's error answer, failing the test if the
// body is not one.
func errorCode(t *testing.T, res *http.Response) string {
	t.Helper()
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if err := json.Unmarshal(b, &body); err != nil || body.Error.Code == "" || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("%s %s: body %q (%s) is not the taxonomy's JSON", res.Request.Method, res.Request.URL.Path, b, res.Header.Get("Content-Type"))
	}
	return body.Error.Code
}

// TestHardenedSurfaces: a 100 MB MCP request is refused without the daemon
// holding it, and every error answer is the taxonomy's JSON.
func TestHardenedSurfaces(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	base := "http://" + d.HTTPAddr
	c := &http.Client{Timeout: 60 * time.Second}
	do := func(method, path string, body io.Reader, size int64, hdr ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size
		req.Header.Set("Authorization", "Bearer "+d.Token())
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return res
	}
	// Start waits for the unix socket; the TCP listener follows it.
	for i := 0; ; i++ {
		res, err := c.Get(base + "/healthz")
		if err == nil {
			res.Body.Close()
			break
		}
		if i == 100 {
			t.Fatalf("TCP listener: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mcpHdr := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}

	pid := d.PID()
	before := rssBytes(t, pid)
	const size = 100 << 20
	// With a Content-Length: refused before the body is read.
	res := do("POST", "/mcp", bigMCPBody(size), size, mcpHdr...)
	if res.StatusCode != http.StatusBadRequest || errorCode(t, res) != "invalid_argument" {
		t.Errorf("100 MB MCP request with Content-Length: status %d", res.StatusCode)
	}
	mid := rssBytes(t, pid)
	t.Logf("daemon RSS %.1f MiB before, %.1f MiB after a 100 MB MCP request", float64(before)/(1<<20), float64(mid)/(1<<20))
	if mid-before > 10<<20 {
		t.Errorf("daemon RSS grew by %d MiB", (mid-before)>>20)
	}
	// Chunked (no length): read up to the cap (4 MiB), then refused; the
	// daemon holds at most what the MCP library buffered of the cap.
	res = do("POST", "/mcp", bigMCPBody(size), -1, mcpHdr...)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode < 400 {
		t.Errorf("100 MB chunked MCP request: status %d body %.200q, want a refusal", res.StatusCode, b)
	}
	after := rssBytes(t, pid)
	t.Logf("daemon RSS %.1f MiB after a chunked 100 MB MCP request", float64(after)/(1<<20))
	if after-mid > 3*int64(d.Config.Server.MaxRequestBytes) {
		t.Errorf("daemon RSS grew by %d MiB for a chunked request", (after-mid)>>20)
	}

	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/nosuch", 404, "not_found"},
		{"GET", "/nosuch.html", 404, "not_found"}, // "/" is the web editor
		{"PUT", "/v1/status", 405, "invalid_argument"},
		{"DELETE", "/v1/sandboxes", 405, "invalid_argument"},
		{"GET", "/v1/events", 400, "invalid_argument"}, // no Upgrade
	} {
		res := do(tc.method, tc.path, nil, 0)
		if code := errorCode(t, res); res.StatusCode != tc.status || code != tc.code {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, res.StatusCode, code, tc.status, tc.code)
		}
		if tc.status == 405 && res.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tc.method, tc.path)
		}
	}
	// exec --json keeps binary output byte-exact.
	id := createSandbox(d)
	out := d.MustCtl("exec", "--json", id, "--", "sh", "-c", `printf '\377\376bin\000'; printf text >&2`)
	var er struct {
		Stdout, Stderr string
		StdoutEncoding string `json:"stdout_encoding"`
	}
	if err := json.Unmarshal([]byte(out), &er); err != nil {
		t.Fatalf("exec --json: %v\n%s", err, out)
	}
	raw, err := base64.StdEncoding.DecodeString(er.Stdout)
	if er.StdoutEncoding != "base64" || err != nil || string(raw) != "\xff\xfebin\x00" || er.Stderr != "text" {
		t.Errorf("exec --json of binary output: %s", out)
	}
	d.MustCtl("rm", id)
	// The daemon is healthy after all that.
	if res := do("GET", "/readyz", nil, 0); res.StatusCode != 200 {
		t.Errorf("readyz after the attacks: %d", res.StatusCode)
	}
}
