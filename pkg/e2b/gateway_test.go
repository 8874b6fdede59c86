package e2b

import (
	"net/http/httptest"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// TestGatewayPrincipal: a control-plane call a gateway forwards names its
// caller beside the gateway secret and needs no API key; a principal named
// without the secret, with a wrong one, or on a node that trusts no
// gateway is refused (never downgraded to the API key it also carries); a
// malformed principal is invalid.
func TestGatewayPrincipal(t *testing.T) {
	f := newFake()
	s := New(f, Options{Keys: []string{testKey}, Domain: "e2b.test", GatewaySecret: "gw-secret-0123456789"})
	ts := httptest.NewServer(s)
	defer func() { ts.Close(); s.Close() }()
	alice := `{"key_id":"key-a","key_name":"alice","tenant":"alice"}`

	if st, m, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"base"}`, map[string]string{
		"X-API-Key": "", principal.GatewaySecretHeader: "gw-secret-0123456789", principal.GatewayPrincipalHeader: alice}); st != 201 || m["sandboxID"] == nil {
		t.Fatalf("a create forwarded by a gateway: %d %v", st, m)
	}
	for name, hdr := range map[string]map[string]string{
		"no secret":    {principal.GatewayPrincipalHeader: alice},
		"wrong secret": {principal.GatewaySecretHeader: "gw-secret-guessed-000", principal.GatewayPrincipalHeader: alice},
	} {
		if st, m, _ := call(t, ts, "GET", "/v2/sandboxes", "", hdr); st != 401 || m["code"] != float64(401) {
			t.Errorf("%s (with a valid API key too): %d %v, want 401", name, st, m)
		}
	}
	if st, _, _ := call(t, ts, "GET", "/v2/sandboxes", "", map[string]string{principal.GatewaySecretHeader: "gw-secret-0123456789", principal.GatewayPrincipalHeader: `{"tenant":`}); st != 400 {
		t.Errorf("a malformed principal: %d, want 400", st)
	}
	// A node without node.gateway_secret_file trusts no gateway.
	_, plain := newServer(t)
	if st, _, _ := call(t, plain, "GET", "/v2/sandboxes", "", map[string]string{principal.GatewaySecretHeader: "", principal.GatewayPrincipalHeader: alice}); st != 401 {
		t.Errorf("a principal on a node that trusts no gateway: %d, want 401", st)
	}
}
