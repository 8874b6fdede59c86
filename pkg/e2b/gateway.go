package e2b

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Control-plane calls forwarded by a gateway (pkg/gateway) carry the
// principal the gateway authenticated, beside the gateway secret, instead
// of an X-API-Key: the fleet's keys live in the fleet's store, not this
// node's. The boundary is the REST front end's (pkg/api/gateway.go, whose
// header names these are): a principal named without the right secret is
// refused, never downgraded to key authentication, and the secret is
// compared in constant time. The data plane (envd) is not affected: its
// callers hold the sandbox's access token, which the gateway passes on.
const (
	gatewaySecretHeader    = "X-Sandboxd-Gateway-Secret"
	gatewayPrincipalHeader = "X-Sandboxd-Principal"
)

// gatewayPrincipal returns the principal a gateway forwarded with r: ok is
// false when r names none; err is set when it names one without the
// secret, or a malformed one.
func (s *Server) gatewayPrincipal(r *http.Request) (p principal.Principal, ok bool, err error) {
	sec, named := r.Header.Get(gatewaySecretHeader), r.Header.Get(gatewayPrincipalHeader)
	if sec == "" && named == "" {
		return p, false, nil
	}
	if s.opt.GatewaySecret == "" || subtle.ConstantTimeCompare([]byte(sec), []byte(s.opt.GatewaySecret)) != 1 {
		return p, false, errdefs.Unauthenticatedf("%s: not a gateway of this node", gatewaySecretHeader)
	}
	if named == "" {
		return principal.Principal{KeyName: "gateway", Tenant: "admin", Admin: true}, true, nil
	}
	if len(named) > 4096 || json.Unmarshal([]byte(named), &p) != nil || p.Tenant == "" {
		return principal.Principal{}, false, errdefs.Invalidf("%s: malformed principal", gatewayPrincipalHeader)
	}
	return p, true, nil
}
