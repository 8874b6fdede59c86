package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// decodeError reads an API error response.
func decodeError(t *testing.T, resp *http.Response) client.ErrorBody {
	t.Helper()
	var er client.ErrorResponse
	if err := json.NewDecoder(resp.Body).Decode(&er); err != nil {
		t.Fatalf("decode error body: %v", err)
	}
	return er.Error
}

func TestAuthentication(t *testing.T) {
	ts := newTestServer(t)
	for _, tc := range []struct {
		name, auth string
	}{
		{"no header", ""},
		{"wrong token", "Bearer not-the-token"},
		{"wrong scheme", "Basic " + testToken},
		{"token prefix", "Bearer " + testToken[:len(testToken)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, ts.http.URL+"/v1/sandboxes", strings.NewReader(`{"language":"shell"}`))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
			if h := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
				t.Errorf("WWW-Authenticate %q", h)
			}
			if e := decodeError(t, resp); e.Code != "unauthenticated" || e.Message != "missing or invalid bearer token or session cookie" {
				t.Errorf("error %+v", e)
			}
		})
	}
	all, err := ts.engine.ListSandboxes(context.Background(), "all")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 0 {
		t.Fatalf("unauthenticated requests created %d sandboxes", len(all))
	}
	// Liveness needs no token; everything else does, metrics included.
	if resp := ts.request(t, http.MethodGet, "/healthz", nil, false); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz without token: %d", resp.StatusCode)
	}
	for _, p := range []string{"/readyz", "/metrics", "/v1/status"} {
		if resp := ts.request(t, http.MethodGet, p, nil, false); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without token: %d, want 401", p, resp.StatusCode)
		}
	}
	if _, err := ts.tcp.Health(context.Background()); err != nil {
		t.Errorf("client with token: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	ts := newTestServer(t)
	huge := `{"language":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     errdefs.Code
		message                  string // substring
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", `{"language":`, 400, errdefs.InvalidArgument, "truncated JSON"},
		{"syntax error", "POST", "/v1/sandboxes", `{"language" "shell"}`, 400, errdefs.InvalidArgument, "malformed JSON at byte"},
		{"unknown field", "POST", "/v1/sandboxes", `{"language":"shell","flavour":"x"}`, 400, errdefs.InvalidArgument, `unknown field "flavour"`},
		{"wrong type", "POST", "/v1/sandboxes", `{"memory_mb":"lots"}`, 400, errdefs.InvalidArgument, "memory_mb"},
		{"oversized body", "POST", "/v1/sandboxes", huge, 400, errdefs.InvalidArgument, "larger than 1048576 bytes"},
		{"empty body", "POST", "/v1/sandboxes", ``, 400, errdefs.InvalidArgument, "empty"},
		{"trailing data", "POST", "/v1/sandboxes", `{"language":"shell"} {}`, 400, errdefs.InvalidArgument, "after the JSON object"},
		{"engine validation", "POST", "/v1/sandboxes", `{"language":"cobol"}`, 400, errdefs.InvalidArgument, "language"},
		{"exec body mismatch", "POST", "/v1/sandboxes/sb-a/exec", `{"sandbox_id":"sb-b","command":"true"}`, 400, errdefs.InvalidArgument, "sandbox_id"},
		{"bad state", "GET", "/v1/sandboxes?state=sleeping", ``, 400, errdefs.InvalidArgument, "state"},
		{"bad bool", "GET", "/v1/sandboxes/sb-nope/files?path=/x&list=maybe", ``, 400, errdefs.InvalidArgument, "list"},
		{"bad mode", "PUT", "/v1/sandboxes/sb-nope/files?path=/x&mode=999", `x`, 400, errdefs.InvalidArgument, "mode"},
		{"setuid mode", "PUT", "/v1/sandboxes/sb-nope/files?path=/x&mode=4755", `x`, 400, errdefs.InvalidArgument, "mode"},
		{"bad rows", "GET", "/v1/sandboxes/sb-nope/terminal?rows=-1", ``, 400, errdefs.InvalidArgument, "rows"},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-nope", ``, 404, errdefs.NotFound, "sb-nope"},
		{"terminate unknown", "DELETE", "/v1/sandboxes/sb-nope", ``, 404, errdefs.NotFound, "sb-nope"},
		{"exec unknown", "POST", "/v1/sandboxes/sb-nope/exec", `{"command":"true"}`, 404, errdefs.NotFound, "sb-nope"},
		{"read unknown", "GET", "/v1/sandboxes/sb-nope/files?path=/etc/hostname", ``, 404, errdefs.NotFound, "sb-nope"},
		{"list unknown", "GET", "/v1/sandboxes/sb-nope/files?list=true", ``, 404, errdefs.NotFound, "sb-nope"},
		{"write unknown", "PUT", "/v1/sandboxes/sb-nope/files?path=/x", `x`, 404, errdefs.NotFound, "sb-nope"},
		{"delete unknown", "DELETE", "/v1/sandboxes/sb-nope/files?path=/x", ``, 404, errdefs.NotFound, "sb-nope"},
		{"terminal unknown", "GET", "/v1/sandboxes/sb-nope/terminal", ``, 404, errdefs.NotFound, "sb-nope"},
		{"autofix max_retries 0", "POST", "/v1/autofix", `{"language":"shell","code":"false","max_retries":0}`, 400, errdefs.InvalidArgument, "max_retries"},
		{"autofix unknown provider", "POST", "/v1/autofix", `{"language":"shell","code":"false","provider":"gpt"}`, 400, errdefs.InvalidArgument, "provider"},
		{"autofix unknown", "GET", "/v1/autofix/af-0123456789abcdef", ``, 404, errdefs.NotFound, "af-0123456789abcdef"},
		{"autofix malformed id", "POST", "/v1/autofix/nope/submit", `{"code":"x"}`, 400, errdefs.InvalidArgument, "autofix_id"},
		{"export format", "GET", "/v1/runs/export?format=csv", ``, 400, errdefs.InvalidArgument, "format"},
		{"network unknown", "GET", "/v1/sandboxes/sb-nope/network", ``, 404, errdefs.NotFound, "sb-nope"},
		{"network without mode", "PUT", "/v1/sandboxes/sb-nope/network", `{}`, 400, errdefs.InvalidArgument, "mode"},
		{"network body mismatch", "PUT", "/v1/sandboxes/sb-a/network", `{"sandbox_id":"sb-b","mode":"egress"}`, 400, errdefs.InvalidArgument, "sandbox_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.request(t, tc.method, tc.path, strings.NewReader(tc.body), true)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			e := decodeError(t, resp)
			if e.Code != string(tc.code) || !strings.Contains(e.Message, tc.message) {
				t.Errorf("error %+v, want code %s and a message with %q", e, tc.code, tc.message)
			}
		})
	}
	t.Run("upload without length", func(t *testing.T) {
		// An io.Reader of unknown length makes net/http send chunked.
		resp := ts.request(t, http.MethodPut, "/v1/sandboxes/sb-nope/files?path=/x", io.MultiReader(strings.NewReader("x")), true)
		if e := decodeError(t, resp); resp.StatusCode != 400 || !strings.Contains(e.Message, "Content-Length") {
			t.Errorf("status %d, error %+v", resp.StatusCode, e)
		}
	})
	t.Run("client maps codes", func(t *testing.T) {
		_, err := ts.unix.GetSandbox(context.Background(), "sb-nope")
		if !errdefs.Is(err, errdefs.NotFound) {
			t.Errorf("GetSandbox: %v, want not_found", err)
		}
	})
}

// TestSandboxLifecycle goes through one sandbox's life over both transports:
// create, exec with streamed output, files in and out, terminate.
func TestSandboxLifecycle(t *testing.T) {
	ts := newTestServer(t)
	ctx := context.Background()
	id := ts.createSandbox(t)

	t.Run("get and list", func(t *testing.T) {
		d, err := ts.tcp.GetSandbox(ctx, id)
		if err != nil || d.State != "ready" || d.Language != "shell" {
			t.Fatalf("get: %+v, %v", d, err)
		}
		l, err := ts.unix.ListSandboxes(ctx, "")
		if err != nil || len(l) != 1 || l[0].ID != id {
			t.Fatalf("list: %+v, %v", l, err)
		}
	})

	t.Run("exec stream", func(t *testing.T) {
		body := `{"command":"echo out; echo err >&2; printf 'ünï'; exit 7"}`
		resp := ts.request(t, http.MethodPost, "/v1/sandboxes/"+id+"/exec", strings.NewReader(body), true)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var stdout, stderr string
		var exit map[string]json.RawMessage
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if exit != nil {
				t.Fatalf("line after the exit line: %s", sc.Text())
			}
			var line struct {
				Stream, Data, Encoding string
				Exit                   map[string]json.RawMessage
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			switch {
			case line.Exit != nil:
				exit = line.Exit
			case line.Stream == "stdout" && line.Encoding == "":
				stdout += line.Data
			case line.Stream == "stderr" && line.Encoding == "":
				stderr += line.Data
			default:
				t.Fatalf("unexpected line %s", sc.Text())
			}
		}
		if stdout != "out\nünï" || stderr != "err\n" {
			t.Errorf("stdout %q, stderr %q", stdout, stderr)
		}
		if string(exit["exit_code"]) != "7" || !bytes.Contains(exit["termination"], []byte(`"exited"`)) {
			t.Errorf("exit line %v", exit)
		}
		if _, ok := exit["stdout"]; ok {
			t.Errorf("exit line carries stdout again")
		}
	})

	t.Run("exec binary output through the client", func(t *testing.T) {
		var mu sync.Mutex
		var streamed bytes.Buffer
		res, err := ts.tcp.Exec(ctx, id, client.ExecRequest{Argv: []string{"printf", `\377\000\376abc`}}, func(stream string, data []byte) {
			mu.Lock()
			defer mu.Unlock()
			streamed.Write(data)
		})
		if err != nil {
			t.Fatal(err)
		}
		want := "\xff\x00\xfeabc"
		if res.ExitCode != 0 || res.Stdout != want || streamed.String() != want {
			t.Errorf("exit %d, stdout %q, streamed %q; want %q", res.ExitCode, res.Stdout, streamed.String(), want)
		}
	})

	t.Run("files", func(t *testing.T) {
		data := make([]byte, 5<<20+123)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		resp := ts.request(t, http.MethodPut, "/v1/sandboxes/"+id+"/files?path=/workspace/dir/blob.bin&mode=0600", bytes.NewReader(data), true)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: %d %+v", resp.StatusCode, decodeError(t, resp))
		}
		var fr client.FileResult
		if err := json.NewDecoder(resp.Body).Decode(&fr); err != nil || fr.Size != int64(len(data)) {
			t.Fatalf("upload result %+v, %v", fr, err)
		}

		resp = ts.request(t, http.MethodGet, "/v1/sandboxes/"+id+"/files?path=/workspace/dir/blob.bin", nil, true)
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
			t.Fatalf("download: status %d, %d bytes (want %d), equal %v, %v", resp.StatusCode, len(got), len(data), bytes.Equal(got, data), err)
		}
		if resp.Header.Get("Content-Type") != "application/octet-stream" || resp.Header.Get("X-File-Truncated") != "false" ||
			resp.Header.Get("X-File-Size") != "5243003" {
			t.Errorf("download headers %v", resp.Header)
		}

		// The client pages through the file as sandboxctl cp does.
		var buf bytes.Buffer
		for off := int64(0); ; {
			fd, err := ts.unix.ReadFile(ctx, id, "/workspace/dir/blob.bin", off, 1<<20, &buf)
			if err != nil {
				t.Fatal(err)
			}
			off += fd.N
			if !fd.Truncated {
				break
			}
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("paged download differs (%d bytes)", buf.Len())
		}

		entries, err := ts.tcp.ListFiles(ctx, id, "/workspace", true)
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, e := range entries {
			if e.Path == "/workspace/dir/blob.bin" {
				found = e.Size == int64(len(data)) && e.Mode == 0o600 && e.Type == "file"
			}
		}
		if !found {
			t.Errorf("listing %+v lacks blob.bin (size %d, mode 0600)", entries, len(data))
		}

		if _, err := ts.unix.DeleteFile(ctx, id, "/workspace/dir", false); err == nil {
			t.Errorf("deleting a non-empty directory without recursive succeeded")
		}
		if _, err := ts.unix.DeleteFile(ctx, id, "/workspace/dir", true); err != nil {
			t.Fatal(err)
		}
		_, err = ts.unix.ReadFile(ctx, id, "/workspace/dir/blob.bin", 0, 0, io.Discard)
		if !errdefs.Is(err, errdefs.NotFound) {
			t.Errorf("read after delete: %v, want not_found", err)
		}
	})

	t.Run("terminate", func(t *testing.T) {
		resp := ts.request(t, http.MethodDelete, "/v1/sandboxes/"+id, nil, true)
		var sb client.Sandbox
		if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || resp.StatusCode != http.StatusOK || sb.State != "terminated" {
			t.Fatalf("terminate: %d %+v %v", resp.StatusCode, sb, err)
		}
		_, err := ts.unix.Exec(ctx, id, client.ExecRequest{Command: "true"}, nil)
		if err == nil || errdefs.CodeOf(err) == errdefs.Internal {
			t.Errorf("exec in a terminated sandbox: %v", err)
		}
	})
}

func TestTerminal(t *testing.T) {
	ts := newTestServer(t)
	id := ts.createSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	term, err := ts.tcp.OpenTerminal(ctx, id, client.TerminalRequest{Argv: []string{"/bin/sh"}, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()

	var mu sync.Mutex
	var screen strings.Builder
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for chunk := range term.Output() {
			mu.Lock()
			screen.Write(chunk)
			mu.Unlock()
		}
	}()
	waitFor := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			ok := strings.Contains(screen.String(), what)
			mu.Unlock()
			if ok {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no %q on the terminal; it shows:\n%s", what, screen.String())
	}

	if _, err := term.Write([]byte("tty\n")); err != nil {
		t.Fatal(err)
	}
	waitFor("/dev/pts/")
	if err := term.Resize(50, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := term.Write([]byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	waitFor("50 100")
	if _, err := term.Write([]byte("exit 3\n")); err != nil {
		t.Fatal(err)
	}
	<-drained
	res, err := term.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Termination.Cause != "exited" {
		t.Errorf("exit %d, termination %+v; want 3, exited", res.ExitCode, res.Termination)
	}
}

func TestEvents(t *testing.T) {
	ts := newTestServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := ts.createSandbox(t)
	events := make(chan client.Event, 256)
	subscribed := make(chan error, 1)
	go func() {
		subscribed <- ts.tcp.Events(ctx, "", func(ev client.Event) error {
			events <- ev
			return nil
		})
	}()
	// The subscription starts some time after the call: run commands in the
	// first sandbox until their events show that it has.
	for live := false; !live; {
		if _, err := ts.unix.Exec(ctx, first, client.ExecRequest{Command: "true"}, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			live = ev.SandboxID == first
		case err := <-subscribed:
			t.Fatalf("event stream ended: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	id := ts.createSandbox(t)
	if _, err := ts.unix.TerminateSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	var seen []string
	timeout := time.After(20 * time.Second)
	for len(seen) == 0 || seen[len(seen)-1] != "terminated" {
		select {
		case ev := <-events:
			if ev.Type == "state" && ev.SandboxID == id {
				seen = append(seen, ev.To)
			}
		case err := <-subscribed:
			t.Fatalf("event stream ended: %v (saw %v)", err, seen)
		case <-timeout:
			t.Fatalf("saw transitions %v, want ... ready ... terminated", seen)
		}
	}
	if !containsInOrder(seen, "ready", "terminated") {
		t.Errorf("transitions %v", seen)
	}
	cancel()
	if err := <-subscribed; err != nil {
		t.Errorf("Events after cancel: %v", err)
	}
}

func containsInOrder(l []string, want ...string) bool {
	for _, s := range l {
		if len(want) > 0 && s == want[0] {
			want = want[1:]
		}
	}
	return len(want) == 0
}

func TestHealthReadinessMetrics(t *testing.T) {
	ts := newTestServer(t)
	ctx := context.Background()
	h, err := ts.unix.Health(ctx)
	if err != nil || h.Status != "ok" || h.Version == "" || h.UptimeS <= 0 {
		t.Errorf("health %+v, %v", h, err)
	}

	resp := ts.request(t, http.MethodGet, "/readyz", nil, true)
	var r client.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range r.Checks {
		names[c.Name] = true
		if c.Status != "ok" && c.Status != "degraded" && c.Status != "failed" {
			t.Errorf("check %+v: bad status", c)
		}
	}
	for _, n := range []string{"store", "cgroups", "seccomp", "images"} {
		if !names[n] {
			t.Errorf("readiness lacks check %q: %+v", n, r.Checks)
		}
	}
	switch {
	case r.Status == "ready" && resp.StatusCode == http.StatusOK:
	case r.Status == "not_ready" && resp.StatusCode == http.StatusServiceUnavailable:
	default:
		t.Errorf("readiness %q with status %d", r.Status, resp.StatusCode)
	}

	st, err := ts.tcp.Status(ctx)
	if err != nil || st.Cgroups == "" || len(st.Checks) == 0 {
		t.Errorf("status %+v, %v", st, err)
	}

	resp = ts.request(t, http.MethodGet, "/metrics", nil, true)
	text, _ := io.ReadAll(resp.Body)
	for _, m := range []string{"sandboxd_sandboxes{state=\"ready\"}", "sandboxd_exec_seconds", "go_goroutines"} {
		if !bytes.Contains(text, []byte(m)) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	imgs, err := ts.unix.Images(ctx)
	if err != nil || len(imgs) == 0 {
		t.Errorf("images %+v, %v", imgs, err)
	}
	if _, err := ts.unix.GC(ctx); err != nil {
		t.Errorf("gc: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	c, err := client.New(client.Options{Socket: "/nonexistent/api.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); !errors.Is(err, client.ErrUnreachable) {
		t.Errorf("Health on a missing socket: %v, want ErrUnreachable", err)
	}
}
