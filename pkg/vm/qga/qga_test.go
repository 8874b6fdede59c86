package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// fakeAgent is a scripted guest agent on the far end of a net.Pipe. It
// implements the wire format (0xFF resync, guest-sync-delimited) itself;
// handle answers the other commands: it returns the raw reply line to
// send, or "" to send nothing, or closes the connection via the agent.
type fakeAgent struct {
	t      *testing.T
	conn   net.Conn
	handle func(a *fakeAgent, cmd string, args json.RawMessage) string
	// syncNoise is written before the delimiter of a sync reply.
	syncNoise string
	mu        sync.Mutex
	files     map[string]*bytes.Buffer
	handles   map[int64]string
	reads     map[int64]int
	next      int64
	calls     []string
}

func newFake(t *testing.T, handle func(a *fakeAgent, cmd string, args json.RawMessage) string) (*Client, *fakeAgent) {
	t.Helper()
	host, guest := net.Pipe()
	a := &fakeAgent{t: t, conn: guest, handle: handle, files: map[string]*bytes.Buffer{}, handles: map[int64]string{}, reads: map[int64]int{}, next: 1000}
	go a.serve()
	c := New(host)
	t.Cleanup(func() { c.Close(); guest.Close() })
	return c, a
}

func (a *fakeAgent) serve() {
	r := bufio.NewReader(a.conn)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		line = bytes.TrimLeft(line, "\xff")
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			a.write(`{"error":{"class":"GenericError","desc":"bad json"}}` + "\n")
			continue
		}
		a.mu.Lock()
		a.calls = append(a.calls, req.Execute)
		a.mu.Unlock()
		if req.Execute == "guest-sync-delimited" {
			var arg struct{ ID int64 }
			_ = json.Unmarshal(req.Arguments, &arg)
			a.write(a.syncNoise + "\xff" + fmt.Sprintf(`{"return": %d}`, arg.ID) + "\n")
			continue
		}
		if rep := a.handle(a, req.Execute, req.Arguments); rep != "" {
			a.write(rep)
		}
	}
}

func (a *fakeAgent) write(s string) { _, _ = io.WriteString(a.conn, s) }

func (a *fakeAgent) called() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}

func ret(v any) string {
	b, _ := json.Marshal(map[string]any{"return": v})
	return string(b) + "\n"
}

// files implements guest-file-* over an in-memory file table.
func (a *fakeAgent) fileCmd(cmd string, raw json.RawMessage) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var args struct {
		Path   string `json:"path"`
		Mode   string `json:"mode"`
		Handle int64  `json:"handle"`
		Buf    string `json:"buf-b64"`
		Count  int    `json:"count"`
		Offset int    `json:"offset"`
		Whence string `json:"whence"`
	}
	_ = json.Unmarshal(raw, &args)
	switch cmd {
	case "guest-file-open":
		if strings.HasPrefix(args.Mode, "w") {
			a.files[args.Path] = &bytes.Buffer{}
		} else if _, ok := a.files[args.Path]; !ok {
			return `{"error":{"class":"GenericError","desc":"failed to open file '` + args.Path + `': No such file or directory"}}` + "\n"
		}
		a.next++
		a.handles[a.next] = args.Path
		return ret(a.next)
	case "guest-file-write":
		b, _ := base64.StdEncoding.DecodeString(args.Buf)
		a.files[a.handles[args.Handle]].Write(b)
		return ret(map[string]any{"count": len(b), "eof": false})
	case "guest-file-read":
		data := a.files[a.handles[args.Handle]].Bytes()
		off := a.reads[args.Handle]
		end := min(off+args.Count, len(data))
		a.reads[args.Handle] = end
		return ret(map[string]any{"count": end - off, "buf-b64": base64.StdEncoding.EncodeToString(data[off:end]), "eof": end == len(data)})
	case "guest-file-seek":
		size := a.files[a.handles[args.Handle]].Len()
		pos := args.Offset
		switch args.Whence {
		case "end":
			pos += size
		case "cur":
			pos += a.reads[args.Handle]
		}
		a.reads[args.Handle] = pos
		return ret(map[string]any{"position": pos, "eof": pos >= size})
	case "guest-file-close":
		delete(a.handles, args.Handle)
		return ret(map[string]any{})
	}
	return ""
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSyncSkipsGarbageAndStaleReplies(t *testing.T) {
	c, a := newFake(t, func(a *fakeAgent, cmd string, _ json.RawMessage) string {
		if cmd == "guest-ping" {
			return ret(map[string]any{})
		}
		return ""
	})
	// Noise a restarted agent or a restored snapshot leaves in the stream:
	// half a line, a stale reply with another id behind its own delimiter.
	a.syncNoise = "garbage{\"ret\xffurn\": 12}\n\xff{\"return\": 99}\n{\"return\":{}}\n"
	if err := c.Ping(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("ping through noise: %v", err)
	}
	if got := a.called(); len(got) != 2 || got[0] != "guest-sync-delimited" || got[1] != "guest-ping" {
		t.Fatalf("calls = %v, want sync then ping", got)
	}
	// Synced now: a second call does not resync.
	if err := c.Ping(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := len(a.called()); n != 3 {
		t.Fatalf("%d calls after second ping, want 3", n)
	}
}

func TestExecPollsAndReportsTruncation(t *testing.T) {
	polls := 0
	c, _ := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string {
		switch cmd {
		case "guest-exec":
			var args struct {
				Path    string   `json:"path"`
				Arg     []string `json:"arg"`
				Capture any      `json:"capture-output"`
				Input   string   `json:"input-data"`
			}
			_ = json.Unmarshal(raw, &args)
			if args.Path != "/bin/sh" || len(args.Arg) != 2 || args.Capture != true || args.Input != base64.StdEncoding.EncodeToString([]byte("in")) {
				return `{"error":{"class":"GenericError","desc":"unexpected arguments"}}` + "\n"
			}
			return ret(map[string]int{"pid": 42})
		case "guest-exec-status":
			polls++
			if polls < 3 {
				return ret(map[string]any{"exited": false})
			}
			return ret(map[string]any{"exited": true, "exitcode": 3,
				"out-data": base64.StdEncoding.EncodeToString([]byte("out")), "out-truncated": true,
				"err-data": base64.StdEncoding.EncodeToString([]byte("err"))})
		}
		return ""
	})
	res, err := c.Exec(ctxT(t, 5*time.Second), ExecRequest{Path: "/bin/sh", Args: []string{"-c", "x"}, Stdin: []byte("in")})
	if err != nil {
		t.Fatal(err)
	}
	if res.PID != 42 || res.ExitCode != 3 || string(res.Stdout) != "out" || string(res.Stderr) != "err" || !res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("result = %+v", res)
	}
	if polls != 3 {
		t.Fatalf("polled %d times, want 3", polls)
	}
}

// TestExecMergedOnOldAgent: qemu-ga before 8.1 (Debian 12's 7.2) takes
// capture-output as a boolean only; its refusal of "merged" (the reply
// below is 7.2's, as seen from the real agent) becomes a clear error.
func TestExecMergedOnOldAgent(t *testing.T) {
	c, _ := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string {
		if cmd == "guest-exec" && strings.Contains(string(raw), `"capture-output":"merged"`) {
			return `{"error":{"class":"GenericError","desc":"Invalid parameter type for 'capture-output', expected: boolean"}}` + "\n"
		}
		return ret(map[string]int{"pid": 1})
	})
	_, err := c.Exec(ctxT(t, 5*time.Second), ExecRequest{Path: "/bin/true", Merged: true})
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "merged: this qemu-ga (older than 8.1)") {
		t.Fatalf("merged on qemu-ga 7.2: %v", err)
	}
}

func TestExecSignalled(t *testing.T) {
	c, _ := newFake(t, func(a *fakeAgent, cmd string, _ json.RawMessage) string {
		if cmd == "guest-exec" {
			return ret(map[string]int{"pid": 7})
		}
		return ret(map[string]any{"exited": true, "signal": 9})
	})
	res, err := c.Exec(ctxT(t, 5*time.Second), ExecRequest{Path: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Signaled || res.Signal != 9 || res.ExitCode != 137 {
		t.Fatalf("result = %+v", res)
	}
}

func TestDeadConnection(t *testing.T) {
	c, _ := newFake(t, func(a *fakeAgent, cmd string, _ json.RawMessage) string {
		a.conn.Close() // the guest died mid-call
		return ""
	})
	err := c.Ping(ctxT(t, 5*time.Second))
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "connection to the guest agent closed") {
		t.Fatalf("err = %v, want unavailable naming the closed connection", err)
	}
	// And stays a clear error, not a hang, on the next call.
	if err := c.Ping(ctxT(t, 5*time.Second)); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("second call: %v", err)
	}
}

func TestNoAnswerTimesOut(t *testing.T) {
	c, _ := newFake(t, func(*fakeAgent, string, json.RawMessage) string { return "" })
	start := time.Now()
	err := c.Ping(ctxT(t, 300*time.Millisecond))
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "guest-ping") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v to time out", d)
	}
}

func TestErrorReplyAndMalformedReplyThenRecovery(t *testing.T) {
	n := 0
	c, a := newFake(t, func(a *fakeAgent, cmd string, _ json.RawMessage) string {
		n++
		switch n {
		case 1:
			return `{"error":{"class":"CommandNotFound","desc":"The command guest-nope has not been found"}}` + "\n"
		case 2:
			return "{not json\n"
		default:
			return ret(map[string]any{})
		}
	})
	err := c.Call(ctxT(t, 5*time.Second), "guest-nope", nil, nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("err = %v, want CommandNotFound", err)
	}
	if err := c.Ping(ctxT(t, 5*time.Second)); !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "malformed reply") {
		t.Fatalf("err = %v, want malformed reply", err)
	}
	if err := c.Ping(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("after a malformed reply the client must resync and work: %v", err)
	}
	syncs := 0
	for _, c := range a.called() {
		if c == "guest-sync-delimited" {
			syncs++
		}
	}
	if syncs != 2 {
		t.Fatalf("%d syncs, want 2 (first call, after the malformed reply)", syncs)
	}
}

func TestFilesChunked(t *testing.T) {
	c, a := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string { return a.fileCmd(cmd, raw) })
	data := make([]byte, 2*WriteChunk+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ctx := ctxT(t, 10*time.Second)
	n, err := c.WriteFile(ctx, "/tmp/f", bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	writes := 0
	for _, c := range a.called() {
		if c == "guest-file-write" {
			writes++
		}
	}
	if writes != 3 {
		t.Fatalf("%d guest-file-write calls, want 3", writes)
	}
	got, err := c.ReadFile(ctx, "/tmp/f", 10<<20)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want %d identical", len(got), err, len(data))
	}
	if _, err := c.ReadFile(ctx, "/tmp/f", 1000); !errdefs.Is(err, errdefs.LimitExceeded) {
		t.Fatalf("read over limit: %v", err)
	}
	var qe *Error
	if _, err := c.ReadFile(ctx, "/missing", 1000); !errors.As(err, &qe) || !strings.Contains(qe.Desc, "No such file") {
		t.Fatalf("missing file: %v", err)
	}
	if len(a.handles) != 0 {
		t.Fatalf("handles left open: %v", a.handles)
	}
}

func TestWindowsPaths(t *testing.T) {
	c, _ := newFake(t, func(*fakeAgent, string, json.RawMessage) string { return "" })
	_, err := c.Exec(ctxT(t, time.Second), ExecRequest{Path: `C:\Windows\System32\cmd.exe`, Merged: true, Windows: true})
	if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "merged") {
		t.Fatalf("merged on windows: %v", err)
	}
	path, args, err := ShellCommand("windows", "dir")
	if err != nil || path != `C:\Windows\System32\cmd.exe` || args[len(args)-1] != "chcp 65001 >NUL & dir" {
		t.Fatalf("ShellCommand = %q %q %v", path, args, err)
	}
	if _, _, err := ShellCommand("plan9", "ls"); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("unknown os: %v", err)
	}
	for _, tc := range []struct {
		os, path string
		ok       bool
	}{
		{"windows", `C:\Users\x.txt`, true}, {"windows", `/etc/passwd`, false}, {"windows", `x.txt`, false},
		{"linux", "/etc/passwd", true}, {"linux", `C:\x`, false}, {"linux", "/a\x00b", false},
	} {
		if err := CheckPath(tc.os, tc.path); (err == nil) != tc.ok {
			t.Errorf("CheckPath(%s, %q) = %v", tc.os, tc.path, err)
		}
	}
	// "Größe: 5\r\n" as cmd.exe prints it in code page 850.
	cp850 := []byte{'G', 'r', 0x94, 0xE1, 'e', ':', ' ', '5', '\r', '\n'}
	if s, err := DecodeOutput(cp850, 850); err != nil || s != "Größe: 5\n" {
		t.Fatalf("cp850: %q %v", s, err)
	}
	if s, err := DecodeOutput([]byte("ok ✓\r\nline\r\n"), 65001); err != nil || s != "ok ✓\nline\n" {
		t.Fatalf("utf-8: %q %v", s, err)
	}
	// Unknown code page, invalid UTF-8: read as the OEM default (437).
	if s, _ := DecodeOutput([]byte{0x81, '\r', '\n'}, 0); s != "ü\n" {
		t.Fatalf("fallback: %q", s)
	}
	if _, err := DecodeOutput(nil, 12345); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "code_page") {
		t.Fatalf("bad code page: %v", err)
	}
}

func TestShutdownNoReplyIsSuccess(t *testing.T) {
	c, _ := newFake(t, func(a *fakeAgent, cmd string, _ json.RawMessage) string {
		if cmd == "guest-shutdown" {
			a.conn.Close() // qemu-ga powers off without answering
		}
		return ""
	})
	if err := c.Shutdown(ctxT(t, 5*time.Second), "powerdown"); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctxT(t, 5*time.Second), "explode"); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("bad mode: %v", err)
	}
}

// TestReadFileAt: a page of a file at an offset, in ReadChunk pieces, with
// the file's size from a seek to its end.
func TestReadFileAt(t *testing.T) {
	c, a := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string { return a.fileCmd(cmd, raw) })
	data := make([]byte, 2*ReadChunk+100)
	for i := range data {
		data[i] = byte(i * 13)
	}
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.WriteFile(ctx, "/f", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	off, max := int64(ReadChunk-5), int64(ReadChunk+10)
	got, size, err := c.ReadFileAt(ctx, "/f", off, max)
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data[off:off+max]) {
		t.Fatalf("page: %d bytes, size %d, %v", len(got), size, err)
	}
	got, size, err = c.ReadFileAt(ctx, "/f", int64(len(data))-3, 100)
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data[len(data)-3:]) {
		t.Fatalf("the tail: %q, size %d, %v", got, size, err)
	}
	if got, size, err := c.ReadFileAt(ctx, "/f", int64(len(data))+5, 100); err != nil || len(got) != 0 || size != int64(len(data)) {
		t.Fatalf("past the end: %q, size %d, %v", got, size, err)
	}
	if len(a.handles) != 0 {
		t.Fatalf("handles left open: %v", a.handles)
	}
}

// TestExecStillRunning: when the context ends first, Exec reports the pid
// (for the caller's kill), and Status reports the outcome once it exited.
func TestExecStillRunning(t *testing.T) {
	var mu sync.Mutex
	exited := false
	c, _ := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string {
		mu.Lock()
		defer mu.Unlock()
		switch cmd {
		case "guest-exec":
			return ret(map[string]int{"pid": 77})
		case "guest-exec-status":
			if !exited {
				return ret(map[string]any{"exited": false})
			}
			return ret(map[string]any{"exited": true, "signal": 9, "out-data": base64.StdEncoding.EncodeToString([]byte("partial"))})
		}
		return ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, ExecRequest{Path: "/bin/sleep", Args: []string{"100"}})
	var re *RunningError
	if !errors.As(err, &re) || re.PID != 77 || !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("exec past its context: %v", err)
	}
	if res, err := c.Status(ctxT(t, time.Second), 77); err != nil || res != nil {
		t.Fatalf("status while running: %+v %v", res, err)
	}
	mu.Lock()
	exited = true
	mu.Unlock()
	res, err := c.Status(ctxT(t, time.Second), 77)
	if err != nil || res == nil || !res.Signaled || res.Signal != 9 || string(res.Stdout) != "partial" {
		t.Fatalf("status after the kill: %+v %v", res, err)
	}
}

// TestExecStillRunningDuringPoll: the context ending while a
// guest-exec-status call waits for its answer is the same RunningError.
func TestExecStillRunningDuringPoll(t *testing.T) {
	c, _ := newFake(t, func(a *fakeAgent, cmd string, raw json.RawMessage) string {
		if cmd == "guest-exec" {
			return ret(map[string]int{"pid": 78})
		}
		return "" // guest-exec-status: no answer
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, ExecRequest{Path: "/bin/true"})
	var re *RunningError
	if !errors.As(err, &re) || re.PID != 78 {
		t.Fatalf("exec whose status poll outlives its context: %v", err)
	}
}
