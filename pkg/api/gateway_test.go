package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// TestGatewayPrincipal: a node trusts the principal a request names only
// beside the gateway secret; a forged, malformed or unconfigured one is
// refused, never downgraded, and a forwarded user principal stays a user.
func TestGatewayPrincipal(t *testing.T) {
	const secret = "gw-secret-0123456789abcdef"
	alice, _ := json.Marshal(principal.Principal{KeyID: "key-a", KeyName: "alice", Tenant: "alice"})
	f := &fakeEngine{}
	node := httptest.NewServer(NewHandler(f, Options{Token: "admin-token-0123456789", GatewaySecret: secret}))
	defer node.Close()
	lone := httptest.NewServer(NewHandler(&fakeEngine{}, Options{Token: "admin-token-0123456789"}))
	defer lone.Close()

	for _, tc := range []struct {
		name, url, path, secret, who string
		want                         int
		wantWho                      principal.Principal
	}{
		{"forged principal, no secret", node.URL, "/v1/sandboxes", "", string(alice), http.StatusUnauthorized, principal.Principal{}},
		{"wrong secret", node.URL, "/v1/sandboxes", secret + "x", string(alice), http.StatusUnauthorized, principal.Principal{}},
		{"node trusts no gateway", lone.URL, "/v1/sandboxes", secret, string(alice), http.StatusUnauthorized, principal.Principal{}},
		{"malformed principal", node.URL, "/v1/sandboxes", secret, `{"tenant":`, http.StatusBadRequest, principal.Principal{}},
		{"principal without tenant", node.URL, "/v1/sandboxes", secret, `{"admin":true}`, http.StatusBadRequest, principal.Principal{}},
		{"user on an admin route", node.URL, "/v1/node", secret, string(alice), http.StatusForbidden, principal.Principal{}},
		{"user forwarded", node.URL, "/v1/sandboxes", secret, string(alice), http.StatusOK, principal.Principal{KeyID: "key-a", KeyName: "alice", Tenant: "alice"}},
		{"gateway's own call", node.URL, "/v1/node", secret, "", http.StatusOK, principal.Principal{KeyName: "gateway", Tenant: "admin", Admin: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.who = principal.Principal{}
			req, _ := http.NewRequest(http.MethodGet, tc.url+tc.path, nil)
			if tc.secret != "" {
				req.Header.Set(GatewaySecretHeader, tc.secret)
			}
			if tc.who != "" {
				req.Header.Set(GatewayPrincipalHeader, tc.who)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.want)
			}
			if f.who != tc.wantWho {
				t.Errorf("engine saw %+v, want %+v", f.who, tc.wantWho)
			}
		})
	}
}
