package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// open opens a fresh store in a temporary directory and closes it with the
// test.
func open(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state", "sandboxd.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, path
}

// insert records a sandbox with the given id and state.
func insert(t *testing.T, s *Store, id, state string) *SandboxRecord {
	t.Helper()
	r := &SandboxRecord{ID: id, State: state, Language: "python", Image: "python", Spec: json.RawMessage(`{"memory":1}`)}
	if err := s.InsertSandbox(context.Background(), r); err != nil {
		t.Fatalf("InsertSandbox(%s): %v", id, err)
	}
	return r
}

func TestOpenConfiguresSQLite(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	pragmas := []struct {
		db   *sql.DB
		name string
		want string
	}{
		{s.r, "journal_mode", "wal"},
		{s.w, "journal_mode", "wal"},
		{s.w, "foreign_keys", "1"},
		{s.w, "synchronous", "1"}, // NORMAL
		{s.w, "busy_timeout", "5000"},
		{s.r, "busy_timeout", "5000"},
		{s.r, "query_only", "1"},
	}
	for _, p := range pragmas {
		var got string
		if err := p.db.QueryRowContext(ctx, "PRAGMA "+p.name).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", p.name, err)
		}
		if got != p.want {
			t.Errorf("PRAGMA %s = %q, want %q", p.name, got, p.want)
		}
	}

	insert(t, s, "sb-1", "creating")
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Errorf("no write-ahead log after a write: %v", err)
	}
	for _, f := range []string{filepath.Dir(path), path, path + "-wal"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s has mode %v, want no access for group and others", f, perm)
		}
	}
	if _, err := s.r.ExecContext(ctx, "DELETE FROM sandboxes"); err == nil {
		t.Error("the read pool accepted a write")
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestMigrationsNumberedWithoutGaps(t *testing.T) {
	for i, m := range migrations {
		if m.version != i+1 {
			t.Fatalf("migrations[%d] has version %d, want %d", i, m.version, i+1)
		}
	}
}

func TestReopenIsIdempotent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sandboxd.db")
	for i := range 3 {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatalf("Open #%d: %v", i+1, err)
		}
		if i == 0 {
			insert(t, s, "sb-1", "ready")
		}
		var versions int
		if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM schema_migrations").Scan(&versions); err != nil {
			t.Fatal(err)
		}
		if versions != len(migrations) {
			t.Errorf("Open #%d: %d rows in schema_migrations, want %d", i+1, versions, len(migrations))
		}
		if _, err := s.GetSandbox(ctx, "sb-1"); err != nil {
			t.Errorf("Open #%d: %v", i+1, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	if _, err := s.w.ExecContext(ctx, "INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)", len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, path)
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open = %v, want ErrSchemaTooNew", err)
	}
}

func TestInsertAndGet(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	created := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))
	want := &SandboxRecord{
		ID: "sb-1", State: "creating", Language: "go", Image: "go", ImageDigest: "sha256:abc",
		Spec: json.RawMessage(`{"limits":{"memory_bytes":536870912},"env":{"A":"b"}}`), CgroupPath: "/mcp-sandboxd/sb-1",
		InitPID: 4242, InitStartTime: 1 << 40, CreatedAt: created,
	}
	if err := s.InsertSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	if !want.UpdatedAt.Equal(created) || !want.LastActiveAt.Equal(created) {
		t.Errorf("InsertSandbox did not default UpdatedAt and LastActiveAt to CreatedAt: %+v", want)
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.CreatedAt.Location() != time.UTC || !got.CreatedAt.Equal(created) {
		t.Errorf("CreatedAt = %v, want %v in UTC", got.CreatedAt, created)
	}
	// Compare the rest with times normalised.
	want.CreatedAt, want.UpdatedAt, want.LastActiveAt = got.CreatedAt, got.UpdatedAt, got.LastActiveAt
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GetSandbox:\n got %+v\nwant %+v", got, want)
	}

	noSpec := &SandboxRecord{ID: "sb-2", State: "creating"}
	if err := s.InsertSandbox(ctx, noSpec); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "sb-2"); err != nil || got.Spec != nil || got.CreatedAt.IsZero() {
		t.Errorf("GetSandbox(sb-2) = %+v, %v; want nil spec and a creation time", got, err)
	}

	events, err := s.Events(ctx, "sb-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].From != "" || events[0].To != "creating" || !events[0].At.Equal(created) {
		t.Errorf("creation events = %+v", events)
	}
}

func TestInsertErrors(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "creating")
	tests := []struct {
		name   string
		r      *SandboxRecord
		target error
	}{
		{"duplicate id", &SandboxRecord{ID: "sb-1", State: "creating"}, ErrAlreadyExists},
		{"no id", &SandboxRecord{State: "creating"}, nil},
		{"no state", &SandboxRecord{ID: "sb-2"}, nil},
		{"invalid spec", &SandboxRecord{ID: "sb-3", State: "creating", Spec: json.RawMessage(`{`)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.InsertSandbox(ctx, tt.r)
			if err == nil || (tt.target != nil && !errors.Is(err, tt.target)) {
				t.Fatalf("InsertSandbox = %v, want an error (matching %v)", err, tt.target)
			}
		})
	}
	if n, _ := s.CountSandboxes(ctx); n != 1 {
		t.Errorf("%d sandboxes after failed inserts, want 1", n)
	}
}

func TestNotFound(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	calls := map[string]func() error{
		"GetSandbox": func() error { _, err := s.GetSandbox(ctx, "nope"); return err },
		"Transition": func() error { return s.Transition(ctx, "nope", "ready", "running", "", nil) },
		"UpdateSandbox": func() error {
			return s.UpdateSandbox(ctx, "nope", func(r *SandboxRecord) { r.InitPID = 1 })
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s = %v, want ErrNotFound", name, err)
		}
	}
}

func TestTransition(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	before := insert(t, s, "sb-1", "creating")

	err := s.Transition(ctx, "sb-1", "creating", "ready", "agent ready", func(r *SandboxRecord) {
		r.InitPID = 99
		r.InitStartTime = 12345
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "sb-1")
	if got.State != "ready" || got.InitPID != 99 || got.InitStartTime != 12345 || got.TerminatedAt != nil ||
		!got.UpdatedAt.After(before.UpdatedAt) {
		t.Errorf("after creating -> ready: %+v", got)
	}

	// Compare-and-set: the sandbox is ready, not creating.
	err = s.Transition(ctx, "sb-1", "creating", "failed", "", nil)
	var mismatch *StateMismatchError
	if !errors.Is(err, ErrStateMismatch) || !errors.As(err, &mismatch) || mismatch.Actual != "ready" || mismatch.Expected != "creating" {
		t.Fatalf("Transition from the wrong state = %v, want a StateMismatchError naming ready", err)
	}

	// mutate may not change the state behind the store's back.
	err = s.Transition(ctx, "sb-1", "ready", "running", "", func(r *SandboxRecord) { r.State = "terminated" })
	if err == nil {
		t.Fatal("Transition accepted a mutate that changed the state")
	}

	if err := s.Transition(ctx, "sb-1", "ready", "terminated", "user request", func(r *SandboxRecord) {
		r.TerminationReason = "user request"
	}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb-1")
	if got.State != "terminated" || got.TerminatedAt == nil || got.TerminationReason != "user request" ||
		got.InitPID != 99 {
		t.Errorf("after ready -> terminated: %+v", got)
	}

	events, err := s.Events(ctx, "sb-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var steps [][3]string
	for _, e := range events {
		if e.SandboxID != "sb-1" || e.At.IsZero() {
			t.Errorf("bad event %+v", e)
		}
		steps = append(steps, [3]string{e.From, e.To, e.Reason})
	}
	want := [][3]string{{"", "creating", "created"}, {"creating", "ready", "agent ready"}, {"ready", "terminated", "user request"}}
	if !reflect.DeepEqual(steps, want) {
		t.Errorf("events = %v, want %v", steps, want)
	}
}

func TestTransitionFailedStampsTerminatedAt(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "creating")
	if err := s.Transition(ctx, "sb-1", "creating", "failed", "image missing", nil); err != nil {
		t.Fatal(err)
	}
	failed, _ := s.GetSandbox(ctx, "sb-1")
	if failed.TerminatedAt == nil {
		t.Fatal("failed sandbox has no TerminatedAt")
	}
	// Terminating a failed sandbox later keeps the time it ended.
	if err := s.Transition(ctx, "sb-1", "failed", "terminated", "cleanup", nil); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "sb-1")
	if !got.TerminatedAt.Equal(*failed.TerminatedAt) {
		t.Errorf("TerminatedAt moved from %v to %v", failed.TerminatedAt, got.TerminatedAt)
	}
}

func TestConcurrentTransitionHasOneWinner(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "ready")

	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		errs    = make([]error, n)
		winners = 0
	)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = s.Transition(ctx, "sb-1", "ready", "running", "exec", nil)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		switch {
		case err == nil:
			winners++
		case !errors.Is(err, ErrStateMismatch):
			t.Errorf("goroutine %d: %v, want success or ErrStateMismatch", i, err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d goroutines won the transition, want exactly 1", winners)
	}
	events, _ := s.Events(ctx, "sb-1", 0, 0)
	if len(events) != 2 {
		t.Fatalf("%d events, want the creation and one transition: %+v", len(events), events)
	}
}

func TestUpdateSandbox(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "ready")
	active := time.Now().Add(time.Minute).UTC()
	if err := s.UpdateSandbox(ctx, "sb-1", func(r *SandboxRecord) {
		r.LastActiveAt = active
		r.InitPID = 7
	}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "sb-1")
	if !got.LastActiveAt.Equal(active) || got.InitPID != 7 || got.State != "ready" {
		t.Errorf("after UpdateSandbox: %+v", got)
	}
	tests := []struct {
		name   string
		mutate func(*SandboxRecord)
	}{
		{"state", func(r *SandboxRecord) { r.State = "running" }},
		{"id", func(r *SandboxRecord) { r.ID = "sb-2" }},
		{"spec", func(r *SandboxRecord) { r.Spec = json.RawMessage("nope") }},
	}
	for _, tt := range tests {
		if err := s.UpdateSandbox(ctx, "sb-1", tt.mutate); err == nil {
			t.Errorf("UpdateSandbox accepted a mutate that changed the %s", tt.name)
		}
	}
	if events, _ := s.Events(ctx, "sb-1", 0, 0); len(events) != 1 {
		t.Errorf("UpdateSandbox wrote events: %+v", events)
	}
}

func TestListAndCount(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	// Inserted out of creation order, to check the ordering.
	base := time.Now().UTC()
	for i, st := range []struct{ id, state string }{
		{"c", "running"}, {"a", "creating"}, {"d", "terminated"}, {"b", "ready"}, {"e", "failed"},
	} {
		r := &SandboxRecord{ID: st.id, State: st.state, CreatedAt: base.Add(time.Duration(st.id[0]-'a') * time.Second)}
		if err := s.InsertSandbox(ctx, r); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	tests := []struct {
		name string
		f    ListFilter
		want []string
	}{
		{"live", ListFilter{}, []string{"a", "b", "c"}},
		{"all", ListFilter{IncludeTerminated: true}, []string{"a", "b", "c", "d", "e"}},
		{"states", ListFilter{States: []string{"ready", "terminated"}}, []string{"b", "d"}},
		{"no match", ListFilter{States: []string{"paused"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := s.ListSandboxes(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if !reflect.DeepEqual(ids, tt.want) {
				t.Errorf("ListSandboxes(%+v) = %v, want %v", tt.f, ids, tt.want)
			}
		})
	}

	counts := []struct {
		states []string
		want   int
	}{
		{nil, 5},
		{[]string{"creating", "ready", "running"}, 3},
		{[]string{"terminated"}, 1},
		{[]string{"paused"}, 0},
	}
	for _, c := range counts {
		if n, err := s.CountSandboxes(ctx, c.states...); err != nil || n != c.want {
			t.Errorf("CountSandboxes(%v) = %d, %v; want %d", c.states, n, err, c.want)
		}
	}
}

func TestEventsPaging(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "ready")
	insert(t, s, "sb-2", "ready")
	for range 3 {
		for _, id := range []string{"sb-1", "sb-2"} {
			if err := s.Transition(ctx, id, "ready", "running", "", nil); err != nil {
				t.Fatal(err)
			}
			if err := s.Transition(ctx, id, "running", "ready", "", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := s.Events(ctx, "", 0, 0)
	if err != nil || len(all) != 14 {
		t.Fatalf("Events(all) = %d events, %v; want 14", len(all), err)
	}
	// Page through sb-1's events three at a time.
	var (
		paged []Event
		since int64
	)
	for {
		page, err := s.Events(ctx, "sb-1", since, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 3 {
			t.Fatalf("page of %d events, limit 3", len(page))
		}
		paged = append(paged, page...)
		since = page[len(page)-1].ID
	}
	if len(paged) != 7 {
		t.Fatalf("paged %d events of sb-1, want 7", len(paged))
	}
	for i, e := range paged {
		if e.SandboxID != "sb-1" || (i > 0 && e.ID <= paged[i-1].ID) {
			t.Fatalf("event %d out of order or from another sandbox: %+v", i, e)
		}
	}
}

func TestDeleteTerminatedBefore(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "live", "ready")
	insert(t, s, "gone", "ready")
	insert(t, s, "broken", "creating")
	if err := s.Transition(ctx, "gone", "ready", "terminated", "", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Transition(ctx, "broken", "creating", "failed", "", nil); err != nil {
		t.Fatal(err)
	}
	lastEvent, _ := s.Events(ctx, "", 0, 0)

	if n, err := s.DeleteTerminatedBefore(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("DeleteTerminatedBefore(an hour ago) = %d, %v; want 0", n, err)
	}
	if n, err := s.DeleteTerminatedBefore(ctx, time.Now().Add(time.Second)); err != nil || n != 2 {
		t.Fatalf("DeleteTerminatedBefore(now) = %d, %v; want 2", n, err)
	}
	if n, _ := s.CountSandboxes(ctx); n != 1 {
		t.Errorf("%d sandboxes left, want 1", n)
	}
	for _, id := range []string{"gone", "broken"} {
		if events, _ := s.Events(ctx, id, 0, 0); len(events) != 0 {
			t.Errorf("events of deleted sandbox %s survived: %+v", id, events)
		}
	}
	// Event ids are never reused, so clients resuming a stream miss nothing.
	if err := s.Transition(ctx, "live", "ready", "running", "", nil); err != nil {
		t.Fatal(err)
	}
	events, _ := s.Events(ctx, "live", 0, 0)
	if newest := events[len(events)-1].ID; newest <= lastEvent[len(lastEvent)-1].ID {
		t.Errorf("event id %d reused (last before deletion was %d)", newest, lastEvent[len(lastEvent)-1].ID)
	}
}

func TestAutofixSessions(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	now := time.Now()
	a := &AutofixSession{ID: "af-1", RunID: "r", SandboxID: "sb-1", Status: "needs_fix", CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(time.Minute), State: json.RawMessage(`{"x":1}`)}
	if err := s.PutAutofixSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetAutofixSession(ctx, "af-1")
	if err != nil || got.Status != "needs_fix" || string(got.State) != `{"x":1}` || !got.ExpiresAt.Equal(a.ExpiresAt.UTC()) {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if _, err := s.GetAutofixSession(ctx, "af-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing session: %v", err)
	}
	if l, err := s.ExpiredAutofixSessions(ctx, "needs_fix", now); err != nil || len(l) != 0 {
		t.Fatalf("expired before expiry: %v, %v", l, err)
	}
	if l, err := s.ExpiredAutofixSessions(ctx, "needs_fix", now.Add(2*time.Minute)); err != nil || len(l) != 1 || l[0].ID != "af-1" {
		t.Fatalf("expired after expiry: %v, %v", l, err)
	}
	if l, err := s.AutofixSessionsByStatus(ctx, "needs_fix"); err != nil || len(l) != 1 {
		t.Fatalf("by status: %v, %v", l, err)
	}
	if n, err := s.DeleteAutofixSessions(ctx, now.Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("deleted a waiting session: %d, %v", n, err)
	}
	a.Status = "fixed"
	if err := s.PutAutofixSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteAutofixSessions(ctx, now.Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("deleted a recent session: %d, %v", n, err)
	}
	if n, err := s.DeleteAutofixSessions(ctx, now.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("retention: %d, %v", n, err)
	}
	a.State = json.RawMessage(`not json`)
	if err := s.PutAutofixSession(ctx, a); err == nil {
		t.Fatal("invalid state stored")
	}
}

// TestCheckWritableFailsOnFullDisk: the readiness probe commits a real
// write, so a full state disk fails it (and freeing space heals it).
func TestCheckWritableFailsOnFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		// internal/testenv imports this package; its RequireRoot rule by hand.
		if os.Getenv("SANDBOXD_INTEGRATION") == "1" {
			t.Fatal("needs root (mounts a tmpfs)")
		}
		t.Skip("needs root (mounts a tmpfs)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CheckWritable(ctx); err != nil {
		t.Fatalf("writable store: %v", err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	var failed error
	// WAL space already allocated can absorb a few commits; a handful of
	// probes must reach the full disk.
	for range 64 {
		if failed = s.CheckWritable(ctx); failed != nil {
			break
		}
	}
	if failed == nil {
		t.Fatal("CheckWritable succeeded on a full disk")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckWritable(ctx); err != nil {
		t.Errorf("after freeing space: %v", err)
	}
}

// TestTransitionActive: a command's transitions change the state, UpdatedAt
// and (when given) LastActiveAt, nothing else, each with its event; the
// compare-and-set and the errors are Transition's; end states are refused.
func TestTransitionActive(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	insert(t, s, "sb-1", "creating")
	if err := s.Transition(ctx, "sb-1", "creating", "ready", "agent ready", func(r *SandboxRecord) {
		r.InitPID, r.InitStartTime = 99, 12345
		r.LastActiveAt = time.Unix(100, 0).UTC()
	}); err != nil {
		t.Fatal(err)
	}
	before, _ := s.GetSandbox(ctx, "sb-1")

	if err := s.TransitionActive(ctx, "sb-1", "ready", "running", "command started", time.Time{}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "sb-1")
	if got.State != "running" || !got.UpdatedAt.After(before.UpdatedAt) || !got.LastActiveAt.Equal(before.LastActiveAt) {
		t.Errorf("after ready -> running: %+v (before %+v)", got, before)
	}
	unchanged := func(got *SandboxRecord) {
		t.Helper()
		if got.InitPID != 99 || got.InitStartTime != 12345 || string(got.Spec) != string(before.Spec) ||
			got.Language != before.Language || !got.CreatedAt.Equal(before.CreatedAt) || got.TerminatedAt != nil {
			t.Errorf("columns changed: %+v, before %+v", got, before)
		}
	}
	unchanged(got)

	active := time.Unix(200, 5).UTC()
	if err := s.TransitionActive(ctx, "sb-1", "running", "ready", "commands finished", active); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb-1")
	if got.State != "ready" || !got.LastActiveAt.Equal(active) {
		t.Errorf("after running -> ready: %+v, want last active %v", got, active)
	}
	unchanged(got)

	err := s.TransitionActive(ctx, "sb-1", "running", "ready", "", time.Time{})
	var mismatch *StateMismatchError
	if !errors.Is(err, ErrStateMismatch) || !errors.As(err, &mismatch) || mismatch.Actual != "ready" || mismatch.Expected != "running" {
		t.Errorf("TransitionActive from the wrong state = %v, want a StateMismatchError naming ready", err)
	}
	if err := s.TransitionActive(ctx, "sb-none", "ready", "running", "", time.Time{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("TransitionActive of no sandbox = %v, want ErrNotFound", err)
	}
	for _, to := range []string{"terminated", "failed", ""} {
		if err := s.TransitionActive(ctx, "sb-1", "ready", to, "", time.Time{}); err == nil {
			t.Errorf("TransitionActive to %q accepted", to)
		}
	}
	if got, _ := s.GetSandbox(ctx, "sb-1"); got.State != "ready" {
		t.Errorf("refused transitions changed the state to %s", got.State)
	}

	events, err := s.Events(ctx, "sb-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var steps [][3]string
	for _, e := range events {
		if e.At.IsZero() {
			t.Errorf("event without time: %+v", e)
		}
		steps = append(steps, [3]string{e.From, e.To, e.Reason})
	}
	want := [][3]string{{"", "creating", "created"}, {"creating", "ready", "agent ready"},
		{"ready", "running", "command started"}, {"running", "ready", "commands finished"}}
	if !reflect.DeepEqual(steps, want) {
		t.Errorf("events = %v, want %v", steps, want)
	}
}

// BenchmarkCommandTransitions: a command's two transitions (ready ->
// running -> ready) through Transition and through TransitionActive.
func BenchmarkCommandTransitions(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	spec := json.RawMessage(`{"language":"shell","image":"shell","limits":{"memory_bytes":536870912,"cpus":1,"pids":256,"disk_bytes":1073741824},"env":{"A":"1"},"labels":{"x":"y"},"network":"none"}`)
	if err := s.InsertSandbox(ctx, &SandboxRecord{ID: "sb-1", State: "ready", Language: "shell", Image: "shell", Spec: spec}); err != nil {
		b.Fatal(err)
	}
	b.Run("Transition", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := s.Transition(ctx, "sb-1", "ready", "running", "command started", nil); err != nil {
				b.Fatal(err)
			}
			if err := s.Transition(ctx, "sb-1", "running", "ready", "commands finished", func(r *SandboxRecord) { r.LastActiveAt = time.Now() }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TransitionActive", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := s.TransitionActive(ctx, "sb-1", "ready", "running", "command started", time.Time{}); err != nil {
				b.Fatal(err)
			}
			if err := s.TransitionActive(ctx, "sb-1", "running", "ready", "commands finished", time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
