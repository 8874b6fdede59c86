package runs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

func openTest(t *testing.T, opt Options) (*Store, *store.Store) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(filepath.Join(t.TempDir(), "runs"), db, opt)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

func TestRecordLayout(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t, Options{LogCap: 10})
	r, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	if !ValidID(r.ID) || filepath.Base(r.Dir) != r.ID {
		t.Fatalf("id %q dir %q", r.ID, r.Dir)
	}
	if err := r.WriteSnapshot("", map[string][]byte{"main.py": []byte("print(1)"), "pkg/mod.py": nil}); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteSnapshot("", map[string][]byte{"../x": nil}); err == nil {
		t.Error("snapshot escaped the record")
	}
	r.Stdout.Write([]byte("0123456789abcdef"))
	r.Stderr.Write([]byte("err"))
	if err := r.WriteJSON(ContainerInfoJSON, map[string]string{"sandboxId": "sb-1"}); err != nil {
		t.Fatal(err)
	}
	m := &Metadata{Language: "python", StartTime: r.StartedAt, EndTime: time.Now(), Success: true, SandboxID: "sb-1",
		Termination: Termination{Cause: "exited"}, StdoutBytes: 16}
	if err := s.Finish(ctx, r, m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"code_snapshot/main.py", "code_snapshot/pkg/mod.py", StdoutLog, StderrLog,
		ContainerInfoJSON, FixedAttemptsJSON, MetadataJSON, OutputDir} {
		if _, err := os.Stat(filepath.Join(r.Dir, f)); err != nil {
			t.Errorf("record lacks %s: %v", f, err)
		}
	}
	got, err := s.Get(ctx, r.ID, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got.Metadata.RunID != r.ID || got.Metadata.StdoutLogged != 10 || got.Stdout != "0123" || !got.StdoutTruncated {
		t.Errorf("Get = %+v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(r.Dir, StdoutLog)); string(b) != "0123456789" {
		t.Errorf("stdout.log = %q, want the first 10 bytes", b)
	}
	list, err := s.List(ctx, store.RunFilter{Language: "python"})
	if err != nil || len(list) != 1 || list[0].RunID != r.ID {
		t.Errorf("List = %v, %v", list, err)
	}
	if _, err := s.Get(ctx, "nope", 0); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("Get(malformed) = %v", err)
	}
	if _, err := s.Get(ctx, "20000101_000000_abcd", 0); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("Get(missing) = %v", err)
	}
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := now
	s, _ := openTest(t, Options{MaxAge: time.Hour, MaxTotalSize: 7000, Now: func() time.Time { return clock }})
	mk := func(at time.Time, size int) string {
		clock = at
		r, err := s.Create()
		if err != nil {
			t.Fatal(err)
		}
		r.Stdout.Write([]byte(strings.Repeat("x", size)))
		if err := s.Finish(ctx, r, &Metadata{Language: "go", StartTime: at, EndTime: at}); err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	old := mk(now.Add(-2*time.Hour), 10)
	a := mk(now.Add(-30*time.Minute), 2000)
	b := mk(now.Add(-20*time.Minute), 2000)
	c := mk(now, 2000) // Finish prunes: old by age, a by size
	for id, want := range map[string]bool{old: false, a: false, b: true, c: true} {
		_, err := os.Stat(filepath.Join(s.Dir(), id))
		if (err == nil) != want {
			t.Errorf("record %s exists = %v, want %v", id, err == nil, want)
		}
		_, err = s.Get(ctx, id, 0)
		if (err == nil) != want {
			t.Errorf("record %s indexed = %v, want %v", id, err == nil, want)
		}
	}
}

// Finish scans every record's size only when retention has something to do
// by its running totals, or pruneRescan after the last scan: a record it
// did not index itself (another daemon's, over a shared database) waits
// for that rescan, and is pruned then.
func TestPruneScansWhenNeeded(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := now
	s, db := openTest(t, Options{MaxAge: time.Hour, MaxTotalSize: 1 << 20, Now: func() time.Time { return clock }})
	mk := func() string {
		r, err := s.Create()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, r, &Metadata{Language: "go", StartTime: clock, EndTime: clock}); err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	indexed := func(id string) bool { _, err := s.Get(ctx, id, 0); return err == nil }
	first := mk() // the first Finish scans
	// Another daemon's record, two hours old, indexed behind this one's back.
	foreign, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	if err := db.PutRun(ctx, &store.RunRecord{ID: foreign.ID, Kind: "run", Language: "go", StartedAt: now.Add(-2 * time.Hour),
		EndedAt: now.Add(-2 * time.Hour), Metadata: []byte(`{"runId":"` + foreign.ID + `"}`)}); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(pruneRescan / 2)
	second := mk()
	if !indexed(foreign.ID) {
		t.Fatal("a Finish within pruneRescan of the last scan scanned again: the foreign record is gone")
	}
	clock = now.Add(pruneRescan + time.Second)
	third := mk()
	if indexed(foreign.ID) {
		t.Fatal("the foreign record, older than max_age, survived the rescan after pruneRescan")
	}
	for _, id := range []string{first, second, third} {
		if !indexed(id) {
			t.Errorf("record %s, within retention, was pruned", id)
		}
	}
	// A record of this daemon's that crosses max_total_size is pruned at once.
	clock = clock.Add(time.Second)
	big, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	big.Stdout.Write([]byte(strings.Repeat("x", 1<<20)))
	if err := s.Finish(ctx, big, &Metadata{Language: "go", StartTime: clock, EndTime: clock}); err != nil {
		t.Fatal(err)
	}
	if indexed(first) {
		t.Error("crossing max_total_size did not prune the oldest record at once")
	}
}

// Reopen continues a record: its logs are appended to under the same cap.
func TestReopen(t *testing.T) {
	rs, _ := openTest(t, Options{LogCap: 10})
	r, err := rs.Create()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r.Stdout.Write([]byte("123456"))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r2, err := rs.Reopen(r.ID, r.StartedAt)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r2.Stdout.Write([]byte("7890abc"))
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(r.Dir, StdoutLog))
	if string(b) != "1234567890" || r2.Stdout.Written() != 10 {
		t.Fatalf("log = %q, written %d", b, r2.Stdout.Written())
	}
	if _, err := rs.Reopen("20990101_000000_ffff", time.Now()); err == nil {
		t.Fatal("reopened a record that does not exist")
	}
	if _, err := rs.Reopen("../x", time.Now()); err == nil {
		t.Fatal("reopened a malformed id")
	}
}
