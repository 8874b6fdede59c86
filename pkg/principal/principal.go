// Package principal names who is calling and through which door: the
// identity every front end (REST, MCP, E2B, SSH, the web editor) attaches to
// a request's context once it has authenticated it, and that the layers
// below read to decide ownership, count quotas, write the audit log and
// label traces. It holds no secrets: a key's secret never leaves the
// authenticator; only its id and name travel.
package principal

import "context"

// Principal is an authenticated caller.
type Principal struct {
	// KeyID is the stable id of the API key the caller presented; empty for
	// the unix socket, whose file mode is its authentication.
	KeyID string `json:"key_id,omitempty"`
	// KeyName is the key's human name (e.g. "ci-agent"), for logs and the
	// audit record.
	KeyName string `json:"key_name,omitempty"`
	// Tenant owns what the caller creates and bounds what it may see.
	// Admin callers act across tenants.
	Tenant string `json:"tenant,omitempty"`
	// Admin callers see and act on every tenant's resources.
	Admin bool `json:"admin,omitempty"`
}

// Origin is where a call came in.
type Origin struct {
	// FrontEnd is the adapter that took the call: "rest", "mcp", "e2b",
	// "ssh", "web" or "socket"; "gateway" on a node for a call a gateway
	// forwarded (pkg/gateway), whose key the fleet's store holds.
	FrontEnd string `json:"front_end,omitempty"`
	// Source is the client's address (host:port), or "unix" for the socket.
	Source string `json:"source,omitempty"`
}

// Socket is the principal of the unix socket: the machine's administrator.
var Socket = Principal{KeyName: "unix-socket", Admin: true}

type principalKey struct{}
type originKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From returns the principal ctx carries; ok is false when no front end
// attached one (engine-internal work such as reaping, reconciliation and
// tests that call the engine directly, which act as the administrator).
func From(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithOrigin returns ctx carrying o.
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, o)
}

// OriginFrom returns the origin ctx carries (zero when none).
func OriginFrom(ctx context.Context) Origin {
	o, _ := ctx.Value(originKey{}).(Origin)
	return o
}
