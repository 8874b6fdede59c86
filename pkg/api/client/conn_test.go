package client

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

const exitLine = `{"exit":{"exit_code":7,"duration_ms":1}}` + "\n"

// sawExit wraps a client connection and signals when a read brought an
// exec stream's exit line: the test's server then ends its answer, so the
// answer's last chunk comes after the client has the line it stops at —
// as the daemon's does, which flushes the exit line before its handler
// returns.
type sawExit struct {
	net.Conn
	ch chan struct{}
}

func (c sawExit) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if bytes.Contains(p[:n], []byte(`{"exit"`)) {
		select {
		case c.ch <- struct{}{}:
		default:
		}
	}
	return n, err
}

// TestReusesConnectionAfterStream: the client reads an exec stream to its
// end (the chunked answer's last chunk after the exit line) before closing
// it, so calls back to back — exec, then a JSON call — keep one connection.
// A stream closed at its exit line took its connection with it, and the
// next call dialled again: half of BenchmarkRESTLifecycle's terminates, the
// call after its exec, did.
func TestReusesConnectionAfterStream(t *testing.T) {
	read := make(chan struct{}, 1)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"sandbox_id":"sb-1","state":"terminated"}` + "\n"))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(exitLine))
		w.(http.Flusher).Flush()
		select { // the client has the exit line (bounded: never hang the test)
		case <-read:
		case <-time.After(5 * time.Second):
		}
	}))
	var conns atomic.Int64
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	hs.Start()
	defer hs.Close()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return sawExit{c, read}, nil
	}}
	defer tr.CloseIdleConnections()
	c, err := New(Options{URL: hs.URL, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const calls = 20
	for i := range calls {
		res, err := c.Exec(ctx, "sb-1", ExecRequest{Argv: []string{"true"}}, nil)
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		if res.ExitCode != 7 {
			t.Fatalf("exec %d: exit code %d, want 7", i, res.ExitCode)
		}
		sb, err := c.TerminateSandbox(ctx, "sb-1")
		if err != nil {
			t.Fatalf("terminate %d: %v", i, err)
		}
		if sb.ID != "sb-1" {
			t.Fatalf("terminate %d: sandbox %q, want sb-1", i, sb.ID)
		}
	}
	// One connection; a few more only if the host stalled the server past
	// the client's bounded wait for a stream's end. Closed at the exit
	// line, every exec after the first dials again.
	if n := conns.Load(); n > calls/4 {
		t.Errorf("%d calls opened %d connections, want 1 (at most %d)", 2*calls, n, calls/4)
	}
}

// TestStreamHeldOpen: a server that sends an exec stream's exit line and
// then holds its answer open does not hold the client: the call returns its
// result once the bounded read of the rest gives up, and the next call
// works (on a new connection).
func TestStreamHeldOpen(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(exitLine))
		w.(http.Flusher).Flush()
		select { // hold the answer open until the client goes or the test ends
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hs.Close()
	defer close(release)
	c, err := New(Options{URL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 2 {
		start := time.Now()
		res, err := c.Exec(context.Background(), "sb-1", ExecRequest{Argv: []string{"true"}}, nil)
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		if res.ExitCode != 7 {
			t.Fatalf("exec %d: exit code %d, want 7", i, res.ExitCode)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("exec %d: returned after %v: the client waited for the held-open answer", i, d)
		}
	}
}
