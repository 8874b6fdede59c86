package e2b

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process/processconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The E2B front end's part of the audit log (pkg/audit): the daemon wraps
// the Server in (*audit.Log).HTTP with AuditClassify; the control plane
// names the API key (never the key itself: an id derived from its hash),
// the data plane the sandbox's envd caller.

// readOnlyRPCs are the envd calls that change nothing (every Connect call
// is a POST).
var readOnlyRPCs = map[string]bool{
	filesystemconnect.FilesystemStatProcedure:             true,
	filesystemconnect.FilesystemListDirProcedure:          true,
	filesystemconnect.FilesystemWatchDirProcedure:         true,
	filesystemconnect.FilesystemGetWatcherEventsProcedure: true,
	processconnect.ProcessListProcedure:                   true,
	processconnect.ProcessConnectProcedure:                true,
}

// AuditClassify names an E2B request for the audit log: control-plane
// routes by their pattern and sandbox id, envd calls by their procedure.
// Traffic relayed to a sandbox's own ports is the sandbox's business, not
// a call to the daemon, and is not recorded.
func (s *Server) AuditClassify(r *http.Request) audit.Classification {
	id, port, routed := s.route(r)
	if routed {
		if port != EnvdPort {
			return audit.Classification{Action: r.Method + " relay", Target: id}
		}
		k := audit.Classification{Action: "envd " + r.URL.Path, Target: id}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			k.Changes = !readOnlyRPCs[r.URL.Path]
		}
		return k
	}
	k := audit.Classification{Action: r.Method + " " + r.URL.Path}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != "/health" {
		k.Changes = true
	}
	// /sandboxes/{id}/... and /v2/sandboxes/{id}/...
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i, p := range parts {
		if p == "sandboxes" && i+1 < len(parts) {
			k.Target = parts[i+1]
		}
	}
	return k
}

// keyPrincipal names an E2B API key: its id is a prefix of its hash, so
// that records tell keys apart without holding them.
func keyPrincipal(key string) principal.Principal {
	sum := sha256.Sum256([]byte(key))
	return principal.Principal{KeyID: "e2b-" + hex.EncodeToString(sum[:6]), KeyName: "e2b-api-key", Admin: true}
}

// envdPrincipal is the caller of a sandbox's envd (the SDK holding the
// sandbox's access token, if it has one).
var envdPrincipal = principal.Principal{KeyName: "e2b-envd"}
