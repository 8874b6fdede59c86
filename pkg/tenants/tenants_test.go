package tenants

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func open(t *testing.T, c *clock, d driver) (*Service, KeyStore) {
	t.Helper()
	ctx := context.Background()
	st := d.open(t)
	s, err := New(ctx, Options{Store: st, AdminToken: "0123456789abcdef-token", FileKeys: []string{"e2b_00112233445566778899"}, Now: c.now, TouchInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, st
}

func wantCode(t *testing.T, err error, code errdefs.Code, what string) {
	t.Helper()
	if errdefs.CodeOf(err) != code {
		t.Fatalf("%s: got %v (%s), want %s", what, err, errdefs.CodeOf(err), code)
	}
}

// TestKeysLifecycle: create, authenticate, list, rotate, revoke, expiry,
// and that the store holds no secret.
func TestKeysLifecycle(t *testing.T) { forDrivers(t, testKeysLifecycle) }

func testKeysLifecycle(t *testing.T, d driver) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s, st := open(t, c, d)

	if p, err := s.Authenticate("0123456789abcdef-token", "10.0.0.1:5"); err != nil || !p.Admin || p.Tenant != AdminTenant {
		t.Fatalf("token file key: %+v, %v", p, err)
	}
	if p, err := s.Authenticate("e2b_00112233445566778899", "10.0.0.1:5"); err != nil || !p.Admin {
		t.Fatalf("e2b file key: %+v, %v", p, err)
	}
	a, err := s.Create(ctx, apitypes.KeyCreateRequest{Name: "alice", Quota: apitypes.Quota{Sandboxes: 2}, ExpiresIn: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(a.Secret) || a.Tenant != "alice" || a.Scope != apitypes.ScopeUser {
		t.Fatalf("created %+v", a)
	}
	p, err := s.Authenticate(a.Secret, "10.0.0.2:1")
	if err != nil || p.Admin || p.Tenant != "alice" || p.KeyID != a.ID || p.KeyName != "alice" {
		t.Fatalf("alice: %+v, %v", p, err)
	}
	recs, _ := st.ListKeys(ctx)
	for _, r := range recs {
		if strings.Contains(string(r.Hash), a.Secret) || strings.Contains(string(r.Quota), a.Secret) {
			t.Fatal("the store holds the secret")
		}
	}
	_, err = s.Create(ctx, apitypes.KeyCreateRequest{Name: "alice"})
	wantCode(t, err, errdefs.Conflict, "duplicate name")
	for _, bad := range []apitypes.KeyCreateRequest{{Name: ""}, {Name: "A B"}, {Name: "x", Tenant: "../t"}, {Name: "x", Quota: apitypes.Quota{Sandboxes: -1}}, {Name: "x", ExpiresIn: -5}} {
		_, err := s.Create(ctx, bad)
		wantCode(t, err, errdefs.InvalidArgument, "create "+bad.Name)
	}

	// Last use is written in a batch, by Flush, not by Authenticate.
	if recs, _ := st.ListKeys(ctx); !recs[0].LastUsedAt.IsZero() {
		t.Fatal("last use written per request")
	}
	s.Flush(ctx)
	if recs, _ := st.ListKeys(ctx); !recs[0].LastUsedAt.Equal(c.now()) {
		t.Fatalf("last use after flush: %v", recs[0].LastUsedAt)
	}

	rot, err := s.Rotate(ctx, a.ID)
	if err != nil || rot.ID != a.ID || rot.Secret == a.Secret {
		t.Fatalf("rotate: %+v, %v", rot, err)
	}
	_, err = s.Authenticate(a.Secret, "10.0.0.2:1")
	wantCode(t, err, errdefs.Unauthenticated, "old secret after rotate")
	if _, err := s.Authenticate(rot.Secret, "10.0.0.2:1"); err != nil {
		t.Fatal(err)
	}

	// Expiry.
	c.add(time.Hour)
	_, err = s.Authenticate(rot.Secret, "10.0.0.2:1")
	wantCode(t, err, errdefs.Unauthenticated, "expired")
	expiredMsg := errdefs.MessageOf(err)

	b, _ := s.Create(ctx, apitypes.KeyCreateRequest{Name: "bob"})
	if _, err := s.Revoke(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(b.Secret, "10.0.0.3:1")
	wantCode(t, err, errdefs.Unauthenticated, "revoked")
	revokedMsg := errdefs.MessageOf(err)
	_, err = s.Authenticate("e2b_0000000000000000000000000000000000000000", "10.0.0.3:1")
	unknownMsg := errdefs.MessageOf(err)
	_, err = s.Authenticate("not a key", "10.0.0.3:1")
	malformedMsg := errdefs.MessageOf(err)
	if expiredMsg != revokedMsg || revokedMsg != unknownMsg || unknownMsg != malformedMsg {
		t.Fatalf("messages differ: %q %q %q %q", expiredMsg, revokedMsg, unknownMsg, malformedMsg)
	}
	_, err = s.Revoke(ctx, "key-token-file")
	wantCode(t, err, errdefs.Conflict, "revoke a file key")
	_, err = s.Revoke(ctx, "key-nope")
	wantCode(t, err, errdefs.NotFound, "revoke unknown")
	_, err = s.Revoke(ctx, "'; DROP TABLE api_keys; --")
	wantCode(t, err, errdefs.InvalidArgument, "revoke hostile id")

	// A restarted daemon loads the keys and not the revoked one.
	s2, err := New(ctx, Options{Store: st, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, ok := s2.Key(b.ID); ok {
		t.Fatal("revoked key loaded")
	}
	keys, err := s2.List(ctx)
	if err != nil || len(keys) != 2 || keys[1].RevokedAt == nil {
		t.Fatalf("list after restart: %+v, %v", keys, err)
	}
}

// TestFailureLimit: a source that keeps failing is refused, others are not.
func TestFailureLimit(t *testing.T) { forDrivers(t, testFailureLimit) }

func testFailureLimit(t *testing.T, d driver) {
	c := &clock{t: time.Now()}
	s, _ := open(t, c, d)
	k, err := s.Create(context.Background(), apitypes.KeyCreateRequest{Name: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		_, err = s.Authenticate("e2b_bad", "192.0.2.9:1234")
	}
	wantCode(t, err, errdefs.LimitExceeded, "attacker after 10000 failures")
	_, err = s.Authenticate(k.Secret, "192.0.2.9:1")
	wantCode(t, err, errdefs.LimitExceeded, "attacker's source with a good key")
	if _, err := s.Authenticate(k.Secret, "198.51.100.1:1"); err != nil {
		t.Fatalf("another source: %v", err)
	}
	c.add(time.Minute) // tokens come back
	if _, err := s.Authenticate(k.Secret, "192.0.2.9:1"); err != nil {
		t.Fatalf("after a minute: %v", err)
	}
}

// TestQuota: each quota refuses, names itself, and frees.
func TestQuota(t *testing.T) { forDrivers(t, testQuota) }

func testQuota(t *testing.T, d driver) {
	ctx := context.Background()
	c := &clock{t: time.Now()}
	s, _ := open(t, c, d)
	k, err := s.Create(ctx, apitypes.KeyCreateRequest{Name: "dave", Quota: apitypes.Quota{Sandboxes: 2, MemoryMB: 1024, CPUs: 2, DiskMB: 2048, CreatesPerMinute: 4}})
	if err != nil {
		t.Fatal(err)
	}
	pctx := principal.With(ctx, principal.Principal{KeyID: k.ID, KeyName: k.Name, Tenant: k.Tenant})
	var live apitypes.KeyUse
	held := func(string) apitypes.KeyUse { return live }
	small := apitypes.Limits{MemoryBytes: 256 << 20, CPUs: 0.5, DiskBytes: 512 << 20}

	_, err = s.Admit(pctx, apitypes.Limits{MemoryBytes: 2048 << 20}, held)
	wantCode(t, err, errdefs.LimitExceeded, "memory")
	if !strings.Contains(errdefs.MessageOf(err), "quota memory_mb") || !strings.Contains(errdefs.MessageOf(err), "1024") {
		t.Fatalf("memory message: %v", err)
	}
	_, err = s.Admit(pctx, apitypes.Limits{CPUs: 3}, held)
	wantCode(t, err, errdefs.LimitExceeded, "cpus")
	_, err = s.Admit(pctx, apitypes.Limits{DiskBytes: 4096 << 20}, held)
	wantCode(t, err, errdefs.LimitExceeded, "disk")

	rel, err := s.Admit(pctx, small, held)
	if err != nil {
		t.Fatal(err)
	}
	rel2, err := s.Admit(pctx, small, held) // two in flight
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Admit(pctx, small, held)
	wantCode(t, err, errdefs.LimitExceeded, "sandboxes while two start")
	if m := errdefs.MessageOf(err); !strings.Contains(m, "quota sandboxes") || !strings.Contains(m, "holds 2") {
		t.Fatalf("sandboxes message: %q", m)
	}
	rel()
	rel() // a second release changes nothing
	rel2()
	live = apitypes.KeyUse{Sandboxes: 2}
	_, err = s.Admit(pctx, small, held)
	wantCode(t, err, errdefs.LimitExceeded, "sandboxes live")
	live = apitypes.KeyUse{} // they ended
	r3, err := s.Admit(pctx, small, held)
	if err != nil {
		t.Fatalf("after the sandboxes ended: %v", err)
	}
	r3()
	r3b, err := s.Admit(pctx, small, held)
	if err != nil {
		t.Fatal(err)
	}
	r3b()
	// Four creates admitted so far (refusals spend no token): the bucket
	// is empty.
	_, err = s.Admit(pctx, small, held)
	wantCode(t, err, errdefs.LimitExceeded, "creates per minute")
	if !strings.Contains(errdefs.MessageOf(err), "quota creates_per_minute") {
		t.Fatalf("rate message: %v", err)
	}
	u, err := s.Usage(k.ID, held)
	if err != nil || u.Use.CreatesLastMinute != 4 || u.Quota.Sandboxes != 2 {
		t.Fatalf("usage %+v, %v", u, err)
	}
	c.add(15 * time.Second) // one token back
	r4, err := s.Admit(pctx, small, held)
	if err != nil {
		t.Fatalf("after 15 s: %v", err)
	}
	r4()
	// No key: no quota.
	if r, err := s.Admit(ctx, apitypes.Limits{MemoryBytes: 1 << 40}, held); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
}

// TestAdmitGatewayKey: a key this node's store does not hold is admitted
// only when a gateway forwarded it (the fleet's store holds it and its
// quota); from any other front end it is refused as a revoked key.
func TestAdmitGatewayKey(t *testing.T) {
	s, _ := open(t, &clock{t: time.Now()}, drivers[0])
	held := func(string) apitypes.KeyUse { return apitypes.KeyUse{} }
	p := principal.Principal{KeyID: "key-fleet-only", KeyName: "alice", Tenant: "alice"}
	for _, fe := range []string{"rest", "mcp", "e2b", "web"} {
		ctx := principal.WithOrigin(principal.With(context.Background(), p), principal.Origin{FrontEnd: fe})
		_, err := s.Admit(ctx, apitypes.Limits{}, held)
		wantCode(t, err, errdefs.Unauthenticated, "")
	}
	ctx := principal.WithOrigin(principal.With(context.Background(), p), principal.Origin{FrontEnd: "gateway"})
	release, err := s.Admit(ctx, apitypes.Limits{}, held)
	if err != nil {
		t.Fatalf("a gateway-forwarded fleet key: %v", err)
	}
	release()
}
