package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// CheckID refuses a sandbox id that is empty or could not be one (too long,
// or holding a path separator, NUL or space), naming the field, so that
// every service validates ids alike before it looks one up.
func CheckID(id string) error {
	if id == "" {
		return errdefs.Invalidf("sandbox_id: required")
	}
	if len(id) > 64 || strings.ContainsAny(id, "/\x00 ") {
		return errdefs.Invalidf("sandbox_id: malformed %q", id)
	}
	return nil
}

// nodeTagLen is the length in hex digits of a node's tag in sandbox ids.
const nodeTagLen = 8

// NodeTag is the tag of node name in the ids of the sandboxes it creates:
// 8 hex digits of the name's SHA-256. Hex, because an id must survive the
// E2B form (pkg/e2b ToE2B/FromE2B: "sb" and hex digits only, the dash
// dropped) and the places ids are checked (SSH users, sb- prefixes); a
// hash, so that a gateway that knows the node names maps a tag back to its
// node without a lookup or a shared table. 32 bits make a collision in a
// fleet of hundreds of nodes negligible, and a gateway refuses a node list
// with one (gateway.CheckTags).
func NodeTag(name string) string {
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:])[:nodeTagLen]
}

// IDNodeTag returns the node tag an id carries: ids of a named node are
// "sb-" + 8 hex digits of tag + 12 of randomness; ids of a lone daemon
// ("sb-" + 12 hex) carry none (ok false).
func IDNodeTag(id string) (tag string, ok bool) {
	rest, found := strings.CutPrefix(id, "sb-")
	if !found || len(rest) != nodeTagLen+12 {
		return "", false
	}
	for _, c := range rest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return rest[:nodeTagLen], true
}
