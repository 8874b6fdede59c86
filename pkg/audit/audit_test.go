package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// memCheckpoints keeps checkpoints in memory; the daemon's are in SQLite
// (pkg/store, tested there and end to end in test/e2e).
type memCheckpoints struct {
	mu  sync.Mutex
	cps map[uint64]Checkpoint
}

func (m *memCheckpoints) SaveAuditCheckpoint(_ context.Context, c Checkpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cps[c.Seq] = c
	return nil
}

func (m *memCheckpoints) AuditCheckpoints(context.Context) ([]Checkpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Checkpoint
	for _, c := range m.cps {
		out = append(out, c)
	}
	return out, nil
}

func (m *memCheckpoints) DeleteAuditCheckpointsBefore(_ context.Context, seq uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s := range m.cps {
		if s < seq {
			delete(m.cps, s)
		}
	}
	return nil
}

func open(t *testing.T, opt Options) *Log {
	t.Helper()
	if opt.Dir == "" {
		opt.Dir = t.TempDir()
	}
	l, err := Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// fill appends n records from 8 goroutines.
func fill(t *testing.T, l *Log, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				if err := l.Append(Record{KeyName: "k", FrontEnd: "rest", Action: "POST /v1/sandboxes/{id}/exec", Target: fmt.Sprintf("sb-%d", i), Outcome: Success}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
}

func lines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A live file ends in its preallocated zeros (not records).
	return bytes.SplitAfter(bytes.TrimRight(b, "\x00"), []byte("\n"))
}

func write(t *testing.T, path string, ls [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(ls, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentAppendsVerify(t *testing.T) {
	l := open(t, Options{})
	fill(t, l, 400)
	rep, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Records != 400 || rep.FirstSeq != 1 || rep.LastSeq != 400 {
		t.Fatalf("report %+v", rep)
	}
	// Every target once: no record lost or doubled by the group commit.
	seen := map[string]bool{}
	for _, ln := range lines(t, filepath.Join(l.Dir(), fileNameOf(1))) {
		if len(ln) == 0 {
			continue
		}
		r, err := parseLine(bytes.TrimSuffix(ln, []byte("\n")))
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Target] {
			t.Fatalf("%s twice", r.Target)
		}
		seen[r.Target] = true
	}
	if len(seen) != 400 {
		t.Fatalf("%d distinct records, want 400", len(seen))
	}
}

// TestTamperNamed: each tampering of a copy of a verified log is found and
// names the record.
func TestTamperNamed(t *testing.T) {
	l := open(t, Options{})
	fill(t, l, 40)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	orig := lines(t, filepath.Join(l.Dir(), fileNameOf(1)))
	cases := []struct {
		name   string
		tamper func(ls [][]byte) [][]byte
		kind   string
		seq    uint64
	}{
		{"byte changed", func(ls [][]byte) [][]byte {
			b := bytes.Clone(ls[9])
			i := bytes.Index(b, []byte(`"sb-`)) + 4
			b[i] ^= 1 // a digit of the target
			ls[9] = b
			return ls
		}, Edited, 10},
		{"byte changed in a key's case", func(ls [][]byte) [][]byte {
			ls[4] = bytes.Replace(ls[4], []byte(`"action"`), []byte(`"Action"`), 1) // Go's JSON would accept it
			return ls
		}, Edited, 5},
		{"line removed", func(ls [][]byte) [][]byte { return append(ls[:19:19], ls[20:]...) }, Removed, 20},
		{"two swapped", func(ls [][]byte) [][]byte { ls[29], ls[30] = ls[30], ls[29]; return ls }, Reordered, 30},
		{"copy inserted", func(ls [][]byte) [][]byte {
			return append(append(ls[:15:15], ls[3]), ls[15:]...)
		}, Inserted, 4},
		{"forged record inserted", func(ls [][]byte) [][]byte {
			// A well-formed record 12 chaining to 11, hashes recomputed:
			// the genuine 12 after it gives it away.
			prev, _ := parseLine(bytes.TrimSuffix(ls[10], []byte("\n")))
			forged := Record{Seq: 12, Time: prev.Time, KeyName: "mallory", FrontEnd: "rest", Action: "DELETE /v1/sandboxes/{id}", Outcome: Success, Prev: prev.Hash}
			b, _ := forged.encode()
			return append(append(ls[:11:11], append(b, '\n')), ls[11:]...)
		}, Inserted, 12},
		{"last line removed", func(ls [][]byte) [][]byte { return ls[:39] }, Removed, 40},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ls := c.tamper(append([][]byte(nil), orig...))
			write(t, filepath.Join(dir, fileNameOf(1)), ls)
			// The last checkpoint catches a cut tail.
			rep, err := VerifyDir(dir, []Checkpoint{{Seq: 40, Hash: mustHash(t, orig[39])}})
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK || rep.Problem == nil {
				t.Fatalf("tampering not detected: %+v", rep)
			}
			if rep.Problem.Kind != c.kind || rep.Problem.Seq != c.seq {
				t.Fatalf("problem %+v, want %s record %d", rep.Problem, c.kind, c.seq)
			}
		})
	}
	// The untouched copy verifies.
	dir := t.TempDir()
	write(t, filepath.Join(dir, fileNameOf(1)), orig)
	if rep, err := VerifyDir(dir, nil); err != nil || !rep.OK || rep.Records != 40 {
		t.Fatalf("untouched: %+v %v", rep, err)
	}
}

func mustHash(t *testing.T, line []byte) string {
	t.Helper()
	r, err := parseLine(bytes.TrimSuffix(line, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	return r.Hash
}

// TestCrashInPreallocatedFile: a daemon killed while it writes leaves its
// file as it was — records, maybe half a line, then the preallocated zeros.
// Verify ignores the zeros and the half line, Export too, and a reopened
// log cuts both off and goes on from the last whole record; a closed file
// holds its records only.
func TestCrashInPreallocatedFile(t *testing.T) {
	live := t.TempDir()
	l := open(t, Options{Dir: live})
	fill(t, l, 10)
	src := filepath.Join(live, fileNameOf(1))
	b, err := os.ReadFile(src) // the file as a kill -9 would leave it
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(b, '\n') + 1
	if len(b)-end < 1024 || len(bytes.Trim(b[end:], "\x00")) != 0 {
		t.Fatalf("live file: %d bytes of records, %d after them (want preallocated zeros)", end, len(b)-end)
	}
	for _, tc := range []struct {
		name string
		torn bool
	}{{"zeros after the last record", false}, {"half a line, then zeros", true}} {
		dir := t.TempDir()
		c := bytes.Clone(b)
		if tc.torn {
			ls := bytes.SplitAfter(b[:end], []byte("\n"))
			copy(c[end:], ls[3][:len(ls[3])/2])
		}
		path := filepath.Join(dir, fileNameOf(1))
		if err := os.WriteFile(path, c, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := VerifyDir(dir, nil)
		if err != nil || !rep.OK || rep.TornTail != tc.torn || rep.LastSeq != 10 || rep.Records != 10 {
			t.Fatalf("%s: %+v %v", tc.name, rep, err)
		}
		var out bytes.Buffer
		if n, err := ExportDir(context.Background(), dir, time.Time{}, &out); err != nil || n != 10 {
			t.Fatalf("%s: export %d %v", tc.name, n, err)
		}
		l2 := open(t, Options{Dir: dir})
		fill(t, l2, 5)
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
		rep, err = VerifyDir(dir, nil)
		if err != nil || !rep.OK || rep.TornTail || rep.LastSeq != 15 {
			t.Fatalf("%s, reopened: %+v %v", tc.name, rep, err)
		}
		closed, _ := os.ReadFile(path)
		if bytes.IndexByte(closed, 0) >= 0 || bytes.Count(closed, []byte("\n")) != 15 || closed[len(closed)-1] != '\n' {
			t.Fatalf("%s: closed file is not 15 whole lines: %d bytes, %d zeros", tc.name, len(closed), bytes.Count(closed, []byte{0}))
		}
	}
}

// TestTornTail: a crash in the middle of a write leaves half a line; it is
// ignored by verify, cut on open, and the chain goes on from the last
// whole record.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	l := open(t, Options{Dir: dir})
	fill(t, l, 10)
	_ = l.Close()
	path := filepath.Join(dir, fileNameOf(1))
	ls := lines(t, path)
	torn := append(bytes.Join(ls, nil), ls[3][:len(ls[3])/2]...)
	if err := os.WriteFile(path, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyDir(dir, nil)
	if err != nil || !rep.OK || !rep.TornTail || rep.LastSeq != 10 {
		t.Fatalf("torn: %+v %v", rep, err)
	}
	l2 := open(t, Options{Dir: dir})
	fill(t, l2, 5)
	rep, err = l2.Verify(context.Background())
	if err != nil || !rep.OK || rep.TornTail || rep.LastSeq != 15 {
		t.Fatalf("after reopen: %+v %v", rep, err)
	}
}

// TestRotationRetentionCheckpoints: files rotate by size, the chain runs on
// across them, retention drops the oldest with their checkpoints, and a
// file removed by hand (its checkpoint still there) is detected.
func TestRotationRetentionCheckpoints(t *testing.T) {
	cps := &memCheckpoints{cps: map[uint64]Checkpoint{}}
	dir := t.TempDir()
	l := open(t, Options{Dir: dir, MaxFileBytes: 4 << 10, MaxTotalBytes: 16 << 10, CheckpointEvery: 5, Checkpoints: cps})
	for i := range 200 {
		if err := l.Append(Record{KeyName: "k", FrontEnd: "rest", Action: "POST /v1/sandboxes", Target: fmt.Sprint(i), Outcome: Success}); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := files(dir)
	if len(names) < 3 {
		t.Fatalf("%d files after 200 records of ~330 bytes with 4K files", len(names))
	}
	var total int64
	for _, n := range names {
		st, _ := os.Stat(filepath.Join(dir, n))
		total += st.Size()
	}
	if total > 16<<10+4<<10 {
		t.Fatalf("retention kept %d bytes", total)
	}
	if names[0] == fileNameOf(1) {
		t.Fatal("retention removed nothing")
	}
	rep, err := l.Verify(context.Background())
	if err != nil || !rep.OK || rep.LastSeq != 200 || rep.FirstSeq == 1 || rep.Checkpoints == 0 {
		t.Fatalf("rotated log: %+v %v", rep, err)
	}
	// Removing the oldest remaining file by hand: its checkpoints remain.
	if err := os.Remove(filepath.Join(dir, names[0])); err != nil {
		t.Fatal(err)
	}
	rep, err = l.Verify(context.Background())
	if err != nil || rep.OK || rep.Problem.Kind != Removed {
		t.Fatalf("file removed by hand: %+v %v", rep, err)
	}
}

// TestRotationByAge: a file older than MaxFileAge is closed for a new one.
func TestRotationByAge(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	dir := t.TempDir()
	l := open(t, Options{Dir: dir, MaxFileAge: time.Hour, Now: clock})
	fill(t, l, 3)
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	fill(t, l, 3)
	names, _ := files(dir)
	if len(names) != 2 || names[1] != fileNameOf(4) {
		t.Fatalf("files %v", names)
	}
	if rep, err := l.Verify(context.Background()); err != nil || !rep.OK || rep.Files != 2 {
		t.Fatalf("%+v %v", rep, err)
	}
}

// TestHTTPMiddleware: a changing request is on disk before its status is
// sent, a read is not recorded, a 401 always is.
func TestHTTPMiddleware(t *testing.T) {
	l := open(t, Options{})
	var before uint64
	h := l.HTTP("rest", func(r *http.Request) Classification {
		return Classification{Action: r.Method + " /x", Target: "t1", Changes: r.Method != http.MethodGet}
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		CallFrom(r.Context()).SetPrincipal(principal.Principal{KeyID: "id1", KeyName: "ci"})
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, before, _ = l.state()
		w.WriteHeader(http.StatusNotFound)
		_, after, _ := l.state()
		if after != before+1 && r.Method != http.MethodGet {
			t.Errorf("status sent with the record not yet durable: seq %d→%d", before, after)
		}
	}))
	for _, m := range []string{http.MethodPost, http.MethodGet} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(m, "/x", nil))
	}
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	req.Header.Set("X-Fail", "1")
	h.ServeHTTP(httptest.NewRecorder(), req)
	ls := lines(t, filepath.Join(l.Dir(), fileNameOf(1)))
	if len(ls) != 3 || len(ls[2]) != 0 {
		t.Fatalf("want 2 records, got %q", ls)
	}
	var r1, r2 Record
	_ = json.Unmarshal(ls[0], &r1)
	_ = json.Unmarshal(ls[1], &r2)
	if r1.Action != "POST /x" || r1.Outcome != Failure || r1.Code != "not_found" || r1.KeyID != "id1" || r1.Target != "t1" {
		t.Fatalf("record 1 %+v", r1)
	}
	if r2.Action != ActionAuthenticate || r2.Code != "unauthenticated" || !strings.Contains(r2.Target, "/x") {
		t.Fatalf("record 2 %+v", r2)
	}
	// Export: OCSF API Activity.
	var out bytes.Buffer
	n, err := l.Export(context.Background(), time.Time{}, &out)
	if err != nil || n != 2 {
		t.Fatalf("export %d %v", n, err)
	}
	var ev map[string]any
	if err := json.Unmarshal(bytes.SplitN(out.Bytes(), []byte("\n"), 2)[0], &ev); err != nil {
		t.Fatal(err)
	}
	if ev["class_uid"] != float64(6003) || ev["status_id"] != float64(2) || ev["status_code"] != "not_found" ||
		ev["actor"].(map[string]any)["user"].(map[string]any)["uid"] != "id1" || ev["type_uid"] != float64(600399) {
		t.Fatalf("OCSF event %v", ev)
	}
	// since filters.
	out.Reset()
	if n, _ := l.Export(context.Background(), time.Now().Add(time.Hour), &out); n != 0 || out.Len() != 0 {
		t.Fatalf("export since the future: %d", n)
	}
}

// TestNilLogCostsNothing: the log off, the middleware is the handler itself.
func TestNilLogCostsNothing(t *testing.T) {
	var l *Log
	h := http.NotFoundHandler()
	if got := l.HTTP("rest", nil, h); fmt.Sprintf("%p", got) != fmt.Sprintf("%p", h) {
		t.Fatal("a nil log wraps the handler")
	}
	if err := l.Append(Record{}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAppend is one record appended and fsynced, alone (the latency a
// call waits for) and from parallel callers (group commit shares fsyncs).
func BenchmarkAppend(b *testing.B) {
	rec := Record{KeyName: "admin-token", FrontEnd: "rest", Source: "127.0.0.1:4000", Action: "POST /v1/sandboxes/{id}/exec", Target: "sb-0123456789", Outcome: Success, Status: 200}
	for _, par := range []bool{false, true} {
		b.Run(fmt.Sprintf("parallel=%v", par), func(b *testing.B) {
			l, err := Open(Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if par {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						_ = l.Append(rec)
					}
				})
				return
			}
			for range b.N {
				_ = l.Append(rec)
			}
		})
	}
}

// TestWebSocketRecorded: a WebSocket upgrade through the middleware (the
// terminal) works and is recorded, as 101, before the connection is handed
// over.
func TestWebSocketRecorded(t *testing.T) {
	l := open(t, Options{})
	srv := httptest.NewServer(l.HTTP("rest", func(r *http.Request) Classification {
		return Classification{Action: "GET /term", Changes: true}
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.CloseNow()
		if _, seq, _ := l.state(); seq != 1 {
			t.Errorf("upgraded with %d records durable, want 1", seq)
		}
		_ = c.Write(r.Context(), websocket.MessageText, []byte("hi"))
		_ = c.Close(websocket.StatusNormalClosure, "")
	})))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/term", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hi" {
		t.Fatalf("read %q %v", msg, err)
	}
	ls := lines(t, filepath.Join(l.Dir(), fileNameOf(1)))
	var r Record
	if len(ls) != 2 || json.Unmarshal(ls[0], &r) != nil || r.Status != http.StatusSwitchingProtocols || r.Outcome != Success {
		t.Fatalf("records %q", ls)
	}
}

// TestPeriodicVerification: with VerifyInterval the log verifies itself at
// once and then on its own, so a record edited on disk turns
// LastVerification (the sandboxd_audit_chain_ok gauge) false without anyone
// calling Verify; Close stops it.
func TestPeriodicVerification(t *testing.T) {
	l := open(t, Options{VerifyInterval: 20 * time.Millisecond})
	fill(t, l, 10)
	waitVerification := func(ok bool, after time.Time) Verification {
		t.Helper()
		deadline := time.Now().Add(time.Minute) // a loaded host; each round takes milliseconds
		for time.Now().Before(deadline) {
			if v, done := l.LastVerification(); done && v.OK == ok && v.At.After(after) {
				return v
			}
			time.Sleep(10 * time.Millisecond)
		}
		v, done := l.LastVerification()
		t.Fatalf("no verification with ok=%v after %v: last %+v (any: %v)", ok, after, v, done)
		return v
	}
	start := time.Now()
	waitVerification(true, start)

	path := filepath.Join(l.Dir(), fileNameOf(1))
	ls := lines(t, path)
	i := bytes.Index(ls[3], []byte(`"sb-`)) + 4 // a digit of record 4's target
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{ls[3][i] ^ 1}, int64(len(bytes.Join(ls[:3], nil))+i)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	edited := time.Now()
	waitVerification(false, edited)

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	v, _ := l.LastVerification()
	time.Sleep(100 * time.Millisecond) // five intervals: none runs after Close
	if w, _ := l.LastVerification(); w != v {
		t.Fatalf("a verification ran after Close: %+v then %+v", v, w)
	}

	var nilLog *Log
	if _, done := nilLog.LastVerification(); done {
		t.Fatal("a nil log reports a verification")
	}
}
