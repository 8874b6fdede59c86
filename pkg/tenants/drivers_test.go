package tenants

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
)

// driver is a KeyStore implementation the tests run against: every test
// of the service runs on each, so that the two keep the same semantics.
type driver struct {
	name string
	open func(t *testing.T) KeyStore
}

var drivers = []driver{
	{"sqlite", func(t *testing.T) KeyStore {
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "sandboxd.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}},
	{"postgres", func(t *testing.T) KeyStore { return openPG(t, testenv.Postgres(t)) }},
}

func openPG(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func forDrivers(t *testing.T, fn func(t *testing.T, d driver)) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) { fn(t, d) })
	}
}

// waitFor polls cond until it holds or 10 s pass: a notification crosses
// processes, so there is nothing to wait on but its effect.
func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%s: not after 10 s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// TestSharedDatabase: two services (two gateways) on one PostgreSQL
// database, each with its own pool, see each other's new keys, rotations
// and revocations without a restart, and last-use batches from both land.
func TestSharedDatabase(t *testing.T) {
	ctx := context.Background()
	url := testenv.Postgres(t)
	newSvc := func() (*Service, *pgstore.Store) {
		st := openPG(t, url)
		s, err := New(ctx, Options{Store: st, TouchInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s, st
	}
	a, st := newSvc()
	b, _ := newSvc()

	k, err := a.Create(ctx, apitypes.KeyCreateRequest{Name: "erin", Quota: apitypes.Quota{Sandboxes: 3}})
	if err != nil {
		t.Fatal(err)
	}
	// Each poll from a source of its own: failed polls must not trip the
	// failure limit of one source.
	src := 0
	source := func() string { src++; return fmt.Sprintf("192.0.2.%d:%d", src%250+1, src) }
	seen := waitFor(t, "key created on a authenticates on b", func() bool {
		_, err := b.Authenticate(k.Secret, source())
		return err == nil
	})
	t.Logf("a key created through one gateway authenticates on the other after %v", seen)
	if bk, ok := b.Key(k.ID); !ok || bk.Quota.Sandboxes != 3 || bk.Tenant != "erin" {
		t.Fatalf("b's copy of the key: %+v, %v", bk, ok)
	}
	if _, err := b.Create(ctx, apitypes.KeyCreateRequest{Name: "erin"}); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Fatalf("same name through the other gateway: %v", err)
	}

	rot, err := b.Rotate(ctx, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rotation on b reaches a", func() bool {
		_, errOld := a.Authenticate(k.Secret, source())
		_, errNew := a.Authenticate(rot.Secret, source())
		return errOld != nil && errNew == nil
	})

	if _, err := b.Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, "revocation on b reaches a", func() bool { return !a.Valid(k.ID) })
	t.Logf("a revocation through one gateway is refused on the other after %v", took)
	_, err = a.Authenticate(rot.Secret, "192.0.2.3:1")
	wantCode(t, err, errdefs.Unauthenticated, "revoked key on the other gateway")

	// Last use from both gateways: the newest wins, whatever the order.
	k2, err := a.Create(ctx, apitypes.KeyCreateRequest{Name: "frank"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "frank on b", func() bool { _, ok := b.Key(k2.ID); return ok })
	if _, err := b.Authenticate(k2.Secret, "192.0.2.4:1"); err != nil {
		t.Fatal(err)
	}
	b.Flush(ctx)
	recs, err := st.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var used time.Time
	for _, r := range recs {
		if r.ID == k2.ID {
			used = r.LastUsedAt
		}
	}
	if used.IsZero() {
		t.Fatal("b's batched last use did not reach the shared store")
	}
	if err := st.TouchKeys(ctx, map[string]time.Time{k2.ID: used.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	recs, _ = st.ListKeys(ctx)
	for _, r := range recs {
		if r.ID == k2.ID && !r.LastUsedAt.Equal(used) {
			t.Fatalf("an older last use went back in time: %v, want %v", r.LastUsedAt, used)
		}
	}
}
