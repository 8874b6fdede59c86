package api

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Requests forwarded by a gateway (pkg/gateway). The gateway authenticated
// the caller against the fleet's tenants; the node trusts the principal it
// names only beside the gateway secret (node.gateway_secret_file), which
// only gateways hold. Security boundary:
//
//   - the caller's own secret is never forwarded (the gateway strips
//     Authorization and cookies), so a node never holds a key it did not
//     issue and a key revoked in the fleet store stops at the gateway;
//   - a request that names a principal without the right secret is
//     refused outright (not downgraded to bearer authentication), so a
//     client that guesses the header names learns nothing but "no";
//   - the secret is compared in constant time.
const (
	// GatewaySecretHeader carries the gateway secret.
	GatewaySecretHeader = "X-Sandboxd-Gateway-Secret"
	// GatewayPrincipalHeader carries the caller's principal as JSON.
	GatewayPrincipalHeader = "X-Sandboxd-Principal"
)

// gatewayPrincipal returns the principal a gateway forwarded with r: ok is
// false when r names none; err is set when it names one without the
// secret or malformed.
func (s *server) gatewayPrincipal(r *http.Request) (p principal.Principal, ok bool, err error) {
	sec, named := r.Header.Get(GatewaySecretHeader), r.Header.Get(GatewayPrincipalHeader)
	if sec == "" && named == "" {
		return p, false, nil
	}
	if s.opt.GatewaySecret == "" || subtle.ConstantTimeCompare([]byte(sec), []byte(s.opt.GatewaySecret)) != 1 {
		return p, false, errdefs.Unauthenticatedf("%s: not a gateway of this node", GatewaySecretHeader)
	}
	if named == "" {
		// The gateway's own calls (capacity, drain): the fleet's admin.
		return principal.Principal{KeyName: "gateway", Tenant: "admin", Admin: true}, true, nil
	}
	if len(named) > 4096 || json.Unmarshal([]byte(named), &p) != nil || p.Tenant == "" {
		return principal.Principal{}, false, errdefs.Invalidf("%s: malformed principal", GatewayPrincipalHeader)
	}
	return p, true, nil
}
