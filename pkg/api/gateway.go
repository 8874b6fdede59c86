package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Requests forwarded by a gateway (pkg/gateway): the boundary is written
// down beside principal.FromGateway, which checks them for every front end.
const (
	// GatewaySecretHeader carries the gateway secret.
	GatewaySecretHeader = principal.GatewaySecretHeader
	// GatewayPrincipalHeader carries the caller's principal as JSON.
	GatewayPrincipalHeader = principal.GatewayPrincipalHeader
)

// gatewayPrincipal returns the principal a gateway forwarded with r (see
// principal.FromGateway).
func (s *server) gatewayPrincipal(r *http.Request) (principal.Principal, bool, error) {
	return principal.FromGateway(r.Header, s.opt.GatewaySecret)
}
