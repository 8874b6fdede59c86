package e2b

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Control-plane calls forwarded by a gateway (pkg/gateway) carry the
// principal the gateway authenticated, beside the gateway secret, instead
// of an X-API-Key: the fleet's keys live in the fleet's store, not this
// node's. The boundary is principal.FromGateway's, the same as REST's. The
// data plane (envd) is not affected: its callers hold the sandbox's access
// token, which the gateway passes on.
func (s *Server) gatewayPrincipal(r *http.Request) (principal.Principal, bool, error) {
	return principal.FromGateway(r.Header, s.opt.GatewaySecret)
}
