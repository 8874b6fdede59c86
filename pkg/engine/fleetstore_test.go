package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestFleetKeys: two daemons' engines with store.postgres_url on one
// database share their API keys: a key created on one authenticates on
// the other, and its revocation on the other is refused on the first,
// without a restart. Each keeps its own state.db for everything else.
func TestFleetKeys(t *testing.T) {
	requireRoot(t)
	url := testenv.Postgres(t)
	withPG := func(c *config.Config) { c.Store.PostgresURL = url }
	a := newTestEngine(t, withPG)
	// Two daemons on one host each need their own subnet: a live daemon's
	// subnet is claimed (pkg/hostclaim), and the second would be refused.
	b := newTestEngine(t, withPG, func(c *config.Config) { c.Network.Subnet = "10.89.0.0/16" })
	if a.cfg.Paths.StateDir == b.cfg.Paths.StateDir {
		t.Fatal("the two engines share a state dir")
	}
	ctx := context.Background()
	k, err := a.Tenants().Create(ctx, apitypes.KeyCreateRequest{Name: "fleet-user", Quota: apitypes.Quota{Sandboxes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	// A notification crosses processes; poll its effect, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for _, ok := b.Tenants().Key(k.ID); !ok; _, ok = b.Tenants().Key(k.ID) {
		if time.Now().After(deadline) {
			t.Fatal("a key created on engine a is not known to engine b after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p, err := b.Tenants().Authenticate(k.Secret, "192.0.2.7:1")
	if err != nil || p.KeyID != k.ID || p.Tenant != "fleet-user" {
		t.Fatalf("authenticate on b: %+v, %v", p, err)
	}
	if _, err := b.Tenants().Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	for a.Tenants().Valid(k.ID) {
		if time.Now().After(deadline) {
			t.Fatal("a key revoked on engine b still valid on engine a")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := a.Tenants().Authenticate(k.Secret, "192.0.2.7:1"); err == nil {
		t.Fatal("revoked key authenticates on a")
	}
}
