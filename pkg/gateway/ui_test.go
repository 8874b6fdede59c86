package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// TestUITokens: a gateway's editor tokens verify on every gateway of the
// same secret and on no other; a login token is not a session (the kind is
// signed); an edited payload, an expired token and garbage are refused;
// without a fleet database a login is redeemed once per gateway.
func TestUITokens(t *testing.T) {
	g1 := New(Options{Secret: "the-gateway-secret-1"})
	g2 := New(Options{Secret: "the-gateway-secret-1"})
	other := New(Options{Secret: "another-fleet-secret"})
	c := uiClaims{P: principal.Principal{KeyID: "key-a", Tenant: "alice"}, Expires: time.Now().Add(time.Minute).Unix(), Nonce: nonce(), CSRF: nonce()}
	tok := g1.sign("session", c)
	if got, ok := g2.verify("session", tok); !ok || got.P.Tenant != "alice" || got.CSRF != c.CSRF {
		t.Fatalf("a session on another gateway of the fleet: %+v %v", got, ok)
	}
	if _, ok := other.verify("session", tok); ok {
		t.Error("a session verified under another secret")
	}
	if _, ok := g1.verify("login", tok); ok {
		t.Error("a session accepted as a login token")
	}
	enc, mac, _ := strings.Cut(tok, ".")
	forged := g1.sign("session", uiClaims{P: principal.Principal{Tenant: "admin", Admin: true}, Expires: c.Expires, Nonce: "x"})
	fenc, _, _ := strings.Cut(forged, ".")
	if _, ok := g1.verify("session", fenc+"."+mac); ok {
		t.Error("another payload under a session's MAC")
	}
	for _, bad := range []string{"", ".", enc, enc + ".", "!!!." + mac, strings.Repeat("a", 9000) + "." + mac} {
		if _, ok := g1.verify("session", bad); ok {
			t.Errorf("garbage %.40q verified", bad)
		}
	}
	old := c
	old.Expires = time.Now().Add(-time.Second).Unix()
	if _, ok := g1.verify("session", g1.sign("session", old)); ok {
		t.Error("an expired session verified")
	}
	exp := time.Now().Add(time.Minute)
	if !g1.logins.use("n1", exp) || g1.logins.use("n1", exp) {
		t.Error("a login nonce: want redeemed once")
	}
}
