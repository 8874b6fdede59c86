package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

func open(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestMigrationsConcurrent: gateways starting at once against an empty
// database apply each migration exactly once; reopening changes nothing;
// a schema newer than the binary is refused.
func TestMigrationsConcurrent(t *testing.T) {
	ctx := context.Background()
	url := testenv.Postgres(t)
	const starters = 6
	var wg sync.WaitGroup
	errs := make([]error, starters)
	stores := make([]*Store, starters)
	for i := range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = Open(ctx, url)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("starter %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	s := open(t, url) // and once more, later
	vs, err := s.Migrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != SchemaVersion() || vs[0] != 1 || vs[len(vs)-1] != SchemaVersion() {
		t.Fatalf("migrations applied: %v, want 1..%d once each", vs, SchemaVersion())
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO pgstore_migrations (version) VALUES ($1)`, SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, url); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("open of a newer schema: %v", err)
	}
}

// TestHostileInput: a bad URL is refused as invalid without echoing it;
// ids are parameters, never SQL.
func TestHostileInput(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"", "postgres://u:secretpw@[::1", "host=/nonexistent port=notaport"} {
		_, err := Open(ctx, bad)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || strings.Contains(fmt.Sprint(err), "secretpw") || !strings.Contains(fmt.Sprint(err), "store.postgres_url") {
			t.Fatalf("open %q: %v (%s)", bad, err, errdefs.CodeOf(err))
		}
	}
	s := open(t, testenv.Postgres(t))
	if err := s.RevokeKey(ctx, "'; DROP TABLE api_keys; --", time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke hostile id: %v", err)
	}
	if _, err := s.ListKeys(ctx); err != nil {
		t.Fatalf("api_keys after a hostile id: %v", err)
	}
	if err := s.ReserveUsage(ctx, "", apitypes.KeyUse{Sandboxes: 1}, apitypes.Quota{}); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(errdefs.MessageOf(err), "key_id") {
		t.Fatalf("reserve without key: %v", err)
	}
	if err := s.ReserveUsage(ctx, "key-x", apitypes.KeyUse{Sandboxes: -5}, apitypes.Quota{}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Fatalf("negative reservation: %v", err)
	}
}

// TestQuotaRace: 2 gateways (pools of their own) × 12 clients create at
// once against a quota of 5 sandboxes: exactly 5 are admitted, the rest
// refused with limit_exceeded; released, the room comes back.
func TestQuotaRace(t *testing.T) {
	ctx := context.Background()
	url := testenv.Postgres(t)
	gateways := []*Store{open(t, url), open(t, url)}
	q := apitypes.Quota{Sandboxes: 5, MemoryMB: 4096}
	one := apitypes.KeyUse{Sandboxes: 1, MemoryMB: 256}
	const perGateway = 12
	var admitted, refused atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, g := range gateways {
		for range perGateway {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := g.ReserveUsage(ctx, "key-race", one, q)
				switch errdefs.CodeOf(err) {
				case "":
					admitted.Add(1)
				case errdefs.LimitExceeded:
					if !strings.Contains(errdefs.MessageOf(err), "quota sandboxes") {
						t.Errorf("refusal names %q", errdefs.MessageOf(err))
					}
					refused.Add(1)
				default:
					t.Errorf("reserve: %v", err)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if admitted.Load() != 5 || refused.Load() != 2*perGateway-5 {
		t.Fatalf("admitted %d, refused %d; want 5 and %d", admitted.Load(), refused.Load(), 2*perGateway-5)
	}
	use, err := gateways[1].Usage(ctx, "key-race")
	if err != nil || use.Sandboxes != 5 || use.MemoryMB != 5*256 {
		t.Fatalf("usage %+v, %v", use, err)
	}
	// Memory binds before the count does.
	err = gateways[0].ReserveUsage(ctx, "key-mem", apitypes.KeyUse{Sandboxes: 1, MemoryMB: 5000}, q)
	if errdefs.CodeOf(err) != errdefs.LimitExceeded || !strings.Contains(errdefs.MessageOf(err), "quota memory_mb") {
		t.Fatalf("memory over quota: %v", err)
	}
	if err := gateways[0].ReleaseUsage(ctx, "key-race", one); err != nil {
		t.Fatal(err)
	}
	if err := gateways[1].ReserveUsage(ctx, "key-race", one, q); err != nil {
		t.Fatalf("after a release on the other gateway: %v", err)
	}
	// Releases never go below zero.
	for range 10 {
		if err := gateways[0].ReleaseUsage(ctx, "key-race", one); err != nil {
			t.Fatal(err)
		}
	}
	if use, _ := gateways[0].Usage(ctx, "key-race"); use.Sandboxes != 0 || use.MemoryMB != 0 {
		t.Fatalf("usage after over-release: %+v", use)
	}
}

// TestAuditLog: records appended from two gateways at once form one
// chain that pkg/audit's verifier accepts, checkpoints included; an edited
// row, a removed row and a rewritten tail are each found.
func TestAuditLog(t *testing.T) {
	ctx := context.Background()
	url := testenv.Postgres(t)
	gateways := []*Store{open(t, url), open(t, url)}
	const perGateway = 40
	var wg sync.WaitGroup
	for gi, g := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGateway {
				r, err := g.AppendAudit(ctx, audit.Record{KeyID: "key-a", FrontEnd: "rest", Source: fmt.Sprintf("gw%d", gi),
					Action: "POST /v1/sandboxes", Target: fmt.Sprintf("sb-%d-%d", gi, i), Outcome: audit.Success, Status: 201})
				if err != nil {
					t.Error(err)
					return
				}
				if r.Seq%16 == 0 {
					if err := g.SaveAuditCheckpoint(ctx, audit.Checkpoint{Seq: r.Seq, Hash: r.Hash, At: r.Time}); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	rep, err := gateways[0].VerifyAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Records != 2*perGateway || rep.FirstSeq != 1 || rep.LastSeq != 2*perGateway || rep.Checkpoints != 5 {
		t.Fatalf("report %+v (problem %+v)", rep, rep.Problem)
	}

	tamper := func(q string, args ...any) {
		t.Helper()
		if _, err := gateways[0].pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(kind string, seq uint64) {
		t.Helper()
		rep, err := gateways[1].VerifyAudit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || rep.Problem == nil || rep.Problem.Kind != kind || rep.Problem.Seq != seq {
			t.Fatalf("want %s at %d, got %+v", kind, seq, rep.Problem)
		}
	}
	tamper(`UPDATE audit_records SET line = replace(line, '"status":201', '"status":200') WHERE seq = 30`)
	expect(audit.Edited, 30)
	tamper(`UPDATE audit_records SET line = replace(line, '"status":200', '"status":201') WHERE seq = 30`)
	tamper(`DELETE FROM audit_records WHERE seq = 41`)
	expect(audit.Removed, 41)

	// A whole tail rewritten, every hash recomputed: only the checkpoints
	// in the database catch it.
	fresh := open(t, testenv.Postgres(t))
	for i := range 20 {
		r, err := fresh.AppendAudit(ctx, audit.Record{FrontEnd: "mcp", Action: "mcp:exec", Target: fmt.Sprint(i), Outcome: audit.Success})
		if err != nil {
			t.Fatal(err)
		}
		if r.Seq == 16 {
			if err := fresh.SaveAuditCheckpoint(ctx, audit.Checkpoint{Seq: r.Seq, Hash: r.Hash, At: r.Time}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := fresh.pool.Exec(ctx, `DELETE FROM audit_records WHERE seq >= 10; UPDATE audit_head SET seq = 9, hash = (SELECT substr(line, length(line) - 65, 64) FROM audit_records WHERE seq = 9)`); err != nil {
		t.Fatal(err)
	}
	for i := range 11 {
		if _, err := fresh.AppendAudit(ctx, audit.Record{FrontEnd: "mcp", Action: "mcp:exec", Target: fmt.Sprint("forged", i), Outcome: audit.Success}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = fresh.VerifyAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.Problem == nil || rep.Problem.Seq != 16 || rep.Problem.Kind != audit.Edited {
		t.Fatalf("rewritten tail: %+v", rep.Problem)
	}
}

// TestWatchKeysReconnects: WatchKeys reports a committed key change, not
// a rolled-back one, and keeps reporting after its listening connection is
// killed by the server (it reconnects, and reports once on reconnecting).
func TestWatchKeysReconnects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	url := testenv.Postgres(t)
	s, other := open(t, url), open(t, url)
	events := make(chan struct{}, 64)
	done := make(chan error, 1)
	go func() { done <- s.WatchKeys(ctx, func() { events <- struct{}{} }) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != context.Canceled {
				t.Errorf("WatchKeys ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("WatchKeys did not end with its context")
		}
	}()
	next := func(what string) {
		t.Helper()
		select {
		case <-events:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no event after 10 s", what)
		}
	}
	drain := func() {
		for {
			select {
			case <-events:
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	}
	next("listening")
	if err := other.InsertKey(ctx, &store.KeyRecord{ID: "key-1", Name: "one", Tenant: "one", Hash: make([]byte, 32), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	next("insert on another pool")
	// A duplicate name rolls back: no event.
	if err := other.InsertKey(ctx, &store.KeyRecord{ID: "key-2", Name: "one", Tenant: "one", Hash: make([]byte, 32), CreatedAt: time.Now()}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	select {
	case <-events:
		t.Fatal("an event for a rolled-back insert")
	case <-time.After(300 * time.Millisecond):
	}
	var killed int
	if err := other.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the listener: %d, %v", killed, err)
	}
	next("reconnected")
	drain()
	if err := other.RevokeKey(ctx, "key-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	next("revoke after the reconnect")
}

// BenchmarkReserveRelease: one fleet-wide quota reservation and its
// release, the cost a gateway adds to a create.
func BenchmarkReserveRelease(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	one, q := apitypes.KeyUse{Sandboxes: 1, MemoryMB: 256}, apitypes.Quota{Sandboxes: 10}
	for b.Loop() {
		if err := s.ReserveUsage(ctx, "key-bench", one, q); err != nil {
			b.Fatal(err)
		}
		if err := s.ReleaseUsage(ctx, "key-bench", one); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendAudit: one record chained and committed.
func BenchmarkAppendAudit(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		if _, err := s.AppendAudit(ctx, audit.Record{FrontEnd: "rest", Action: "POST /v1/sandboxes", Target: "sb-x", Outcome: audit.Success}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFleetReservations: per-sandbox reservations from two gateways keep
// key_usage equal to the key's rows; a release is idempotent whichever
// gateway makes it; reconciliation releases only what a node's list no
// longer holds and was bound before the list; unbound reservations go
// stale; a refused reservation leaves no row.
func TestFleetReservations(t *testing.T) {
	ctx := context.Background()
	url := testenv.Postgres(t)
	a, b := open(t, url), open(t, url)
	q := apitypes.Quota{Sandboxes: 3}
	one := apitypes.KeyUse{Sandboxes: 1, MemoryMB: 256, CPUs: 0.5}
	usage := func(want int) {
		t.Helper()
		use, err := a.Usage(ctx, "key-f")
		if err != nil {
			t.Fatal(err)
		}
		rows, err := b.Reservations(ctx, "key-f")
		if err != nil {
			t.Fatal(err)
		}
		if int(use.Sandboxes) != want || rows != want || use.MemoryMB != int64(want)*256 {
			t.Fatalf("usage %+v with %d rows, want %d sandboxes", use, rows, want)
		}
	}
	r1, err := a.ReserveSandbox(ctx, "key-f", one, q)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.ReserveSandbox(ctx, "key-f", one, q)
	if err != nil {
		t.Fatal(err)
	}
	r3, err := a.ReserveSandbox(ctx, "key-f", one, q)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReserveSandbox(ctx, "key-f", one, q); errdefs.CodeOf(err) != errdefs.LimitExceeded || !strings.Contains(errdefs.MessageOf(err), "quota sandboxes") {
		t.Fatalf("a fourth reservation against 3: %v", err)
	}
	usage(3)
	if _, err := a.ReserveSandbox(ctx, "key-f", apitypes.KeyUse{Sandboxes: 2}, q); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Fatalf("a reservation of two sandboxes: %v", err)
	}
	// A failed create's reservation, released twice (two gateways).
	if err := a.ReleaseReservation(ctx, r3); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseReservation(ctx, r3); err != nil {
		t.Fatal(err)
	}
	usage(2)
	if err := b.BindSandbox(ctx, r3, "sb-x", "node-1"); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("bind of a released reservation: %v", err)
	}
	before, err := a.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.BindSandbox(ctx, r1, "sb-1", "node-1"); err != nil {
		t.Fatal(err)
	}
	if err := b.BindSandbox(ctx, r2, "sb-2", "node-1"); err != nil {
		t.Fatal(err)
	}
	// A list asked for before the binds holds neither: nothing released.
	if n, err := a.ReconcileNode(ctx, "node-1", before, nil); err != nil || n != 0 {
		t.Fatalf("reconcile with an older list: %d, %v", n, err)
	}
	after, _ := b.Now(ctx)
	// Another node's list never releases node-1's.
	if n, err := a.ReconcileNode(ctx, "node-2", after, nil); err != nil || n != 0 {
		t.Fatalf("reconcile of node-2: %d, %v", n, err)
	}
	// sb-1 ended on node-1 (expired): both gateways reconcile at once.
	var wg sync.WaitGroup
	var released atomic.Int32
	for _, g := range []*Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := g.ReconcileNode(ctx, "node-1", after, []string{"sb-2"})
			if err != nil {
				t.Error(err)
			}
			released.Add(int32(n))
		}()
	}
	wg.Wait()
	if released.Load() != 1 {
		t.Fatalf("two reconciliations released %d, want 1 in all", released.Load())
	}
	usage(1)
	// sb-2 terminated through a gateway: released, again harmlessly.
	for _, g := range []*Store{a, b} {
		if err := g.ReleaseSandbox(ctx, "sb-2"); err != nil {
			t.Fatal(err)
		}
	}
	usage(0)
	// A reservation whose gateway died before binding goes stale.
	if _, err := a.ReserveSandbox(ctx, "key-f", one, q); err != nil {
		t.Fatal(err)
	}
	if n, err := b.ReleaseStale(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("release of reservations older than an hour: %d, %v", n, err)
	}
	if n, err := b.ReleaseStale(ctx, 0); err != nil || n != 1 {
		t.Fatalf("release of stale reservations: %d, %v", n, err)
	}
	usage(0)
	// A node gone for good: the operator releases its sandboxes.
	r, _ := a.ReserveSandbox(ctx, "key-f", one, q)
	if err := a.BindSandbox(ctx, r, "sb-9", "node-9"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.ReleaseNode(ctx, "node-9"); err != nil || n != 1 {
		t.Fatalf("release node-9: %d, %v", n, err)
	}
	usage(0)
	// A web editor login token is redeemed once across gateways.
	exp := time.Now().Add(time.Minute)
	if ok, err := a.UseLogin(ctx, "nonce-1", exp); err != nil || !ok {
		t.Fatalf("first redemption: %v %v", ok, err)
	}
	if ok, err := b.UseLogin(ctx, "nonce-1", exp); err != nil || ok {
		t.Fatalf("second redemption through the other gateway: %v %v", ok, err)
	}
	if _, err := a.UseLogin(ctx, "", exp); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Fatalf("an empty nonce: %v", err)
	}
}

// BenchmarkFleetSandbox is a gateway's accounting of one sandbox: reserve
// before placement, bind to the node's answer, release on terminate.
func BenchmarkFleetSandbox(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	one, q := apitypes.KeyUse{Sandboxes: 1, MemoryMB: 256}, apitypes.Quota{Sandboxes: 10}
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("sb-bench-%d", i)
		r, err := s.ReserveSandbox(ctx, "key-bench", one, q)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.BindSandbox(ctx, r, id, "node-1"); err != nil {
			b.Fatal(err)
		}
		if err := s.ReleaseSandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
