package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// BenchmarkPreviewRelay measures requests through the preview listener and
// the agent's relay to a Python http.server in a none sandbox: small GETs
// on kept-alive connections (ns/op is one request) and, reported as
// MB/s, a 64 MiB download.
func BenchmarkPreviewRelay(b *testing.B) {
	d := testenv.NewDaemon(b, "python")
	d.Start()
	id := strings.TrimSpace(d.MustCtl("create", "--lang", "python", "--network", "none"))
	d.MustCtl("exec", id, "--", "sh", "-c", "head -c 67108864 /dev/zero > /workspace/big && echo hi > /workspace/small")
	d.MustCtl("exec", "-d", id, "--", "python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "/workspace", "8000")
	var x apitypes.PortExposure
	if err := json.Unmarshal([]byte(d.MustCtl("port", "--json", id, "8000")), &x); err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Timeout: time.Minute}
	get := func(path string) int64 {
		req, _ := http.NewRequest(http.MethodGet, x.BaseURL+path, nil)
		req.Header.Set(x.TokenHeader, x.Token)
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, x.BaseURL+"small", nil)
		req.Header.Set(x.TokenHeader, x.Token)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the server in the sandbox did not come up")
		}
	}
	start := time.Now()
	n := get("big")
	mibps := float64(n) / (1 << 20) / time.Since(start).Seconds()
	b.ResetTimer()
	for range b.N {
		get("small")
	}
	b.ReportMetric(mibps, "MiB/s")
}
