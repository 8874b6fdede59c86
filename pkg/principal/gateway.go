package principal

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Requests forwarded by a gateway (pkg/gateway) to a node's front ends
// (REST in pkg/api, the E2B control plane in pkg/e2b). The gateway
// authenticated the caller against the fleet's tenants; the node trusts
// the principal it names only beside the gateway secret
// (node.gateway_secret_file), which only gateways hold. Security boundary:
//
//   - the caller's own secret is never forwarded (the gateway strips
//     Authorization, cookies and X-API-Key), so a node never holds a key it
//     did not issue and a key revoked in the fleet store stops at the
//     gateway;
//   - a request that names a principal without the right secret is
//     refused outright (not downgraded to the front end's own key
//     authentication), so a client that guesses the header names learns
//     nothing but "no";
//   - the secret is compared in constant time.
const (
	// GatewaySecretHeader carries the gateway secret.
	GatewaySecretHeader = "X-Sandboxd-Gateway-Secret"
	// GatewayPrincipalHeader carries the caller's principal as JSON.
	GatewayPrincipalHeader = "X-Sandboxd-Principal"
)

// FromGateway returns the principal a gateway forwarded in h, checked
// against the node's gateway secret ("": this node trusts no gateway).
// ok is false when h names none; err is set when it names one without the
// secret, or a malformed one. A request with the secret and no principal
// is the gateway's own call (capacity, drain): the fleet's admin.
func FromGateway(h http.Header, secret string) (p Principal, ok bool, err error) {
	sec, named := h.Get(GatewaySecretHeader), h.Get(GatewayPrincipalHeader)
	if sec == "" && named == "" {
		return p, false, nil
	}
	if secret == "" || subtle.ConstantTimeCompare([]byte(sec), []byte(secret)) != 1 {
		return p, false, errdefs.Unauthenticatedf("%s: not a gateway of this node", GatewaySecretHeader)
	}
	if named == "" {
		return Principal{KeyName: "gateway", Tenant: "admin", Admin: true}, true, nil
	}
	if len(named) > 4096 || json.Unmarshal([]byte(named), &p) != nil || p.Tenant == "" {
		return Principal{}, false, errdefs.Invalidf("%s: malformed principal", GatewayPrincipalHeader)
	}
	return p, true, nil
}
