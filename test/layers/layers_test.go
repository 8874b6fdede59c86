// Package layers checks the import graph against the layering of
// docs/ARCHITECTURE.md: front ends over the engine over the lifecycle over
// the stores and protocols, never upwards. A new package must be given a
// layer here, which is the moment to think about where it belongs.
package layers

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

const module = "github.com/sandboxrunner/mcp-sandboxd/"

// layer of every package, lowest first. A package may import packages of its
// own layer or below; the Go compiler already refuses cycles.
var layer = map[string]int{
	"pkg/errdefs": 0, "pkg/errdefs/errhttp": 0, "pkg/principal": 0, "pkg/version": 0, "pkg/webui": 0, "internal/contract": 0,

	"pkg/apitypes": 1, "pkg/audit": 1, "pkg/config": 1, "pkg/store": 1, "pkg/userns": 1, "pkg/cgroups": 1, "pkg/seccomp": 1, "pkg/storage": 1,
	"internal/crashpoint": 1, "pkg/lifetime": 1, "internal/tsgen": 1,
	// One goroutine waiting for many descriptors (inits' pidfds, seccomp
	// notifications), for pkg/runtime and pkg/seccomp.
	"pkg/fdwatch":   1,
	"pkg/hostclaim": 1, "pkg/landlock": 1,
	// OpenTelemetry traces (over pkg/errdefs and pkg/principal), used from the agent client up.
	"pkg/telemetry": 1,

	"pkg/agent": 2, "pkg/ledger": 2, "pkg/image": 2, "pkg/runtime": 2, "pkg/runs": 2,
	"pkg/artifacts": 2, "pkg/lang": 2, "pkg/network": 2, "pkg/autofix": 2, "pkg/vm/qga": 2, "pkg/vm/vport": 2, "pkg/tenants": 2,
	// The fleet's PostgreSQL store: pkg/store's records, pkg/audit's chain.
	"pkg/store/pgstore": 2,
	// Node discovery through the Kubernetes API (client-go), for the gateway.
	"pkg/kubediscovery": 2,

	"pkg/agent/server": 3, "pkg/sandbox": 3, "pkg/vm": 3,
	// OCI images into the image store (over pkg/image).
	"pkg/oci": 3,

	"pkg/sandbox/container": 4, "pkg/sandbox/qemu": 4,

	// The engine's services (pkg/services/*) sit beside the engine, which
	// composes them; they never import it (forbidden below).
	"pkg/engine": 5, "pkg/services/ports": 5, "pkg/services/snapshots": 5, "pkg/services/images": 5, "pkg/services/agents": 5,
	"pkg/services/pipeline": 5, "pkg/services/fixloop": 5, "pkg/services": 5,
	"pkg/services/sshkeys": 5, "pkg/services/volumes": 5, "pkg/services/webhooks": 5,

	"pkg/api": 6, "pkg/api/client": 6, "pkg/mcpserver": 6, "pkg/preview": 6, "pkg/sshd": 6,
	// The E2B front end and its generated envd protocol code (leaves).
	"pkg/e2b": 6, "pkg/e2b/envdpb/process": 1, "pkg/e2b/envdpb/process/processconnect": 1,
	"pkg/e2b/envdpb/filesystem": 1, "pkg/e2b/envdpb/filesystem/filesystemconnect": 1,
	// The fleet's gateway: a front end over remote node daemons.
	"pkg/gateway": 6,
	// The gateway's MCP engine: pkg/mcpserver's Engine over the nodes' REST
	// API (pkg/api/client), placed and routed by pkg/gateway.
	"pkg/gateway/remote": 6,

	"cmd/mcp-sandboxd": 7, "cmd/sandboxctl": 7, "cmd/sandbox-agent": 7, "cmd/tsgen": 7,
	// Every container's `runc init` (pkg/runtime/initexec.go): libcontainer only.
	"cmd/sandbox-init": 7,
	// make image's builder (a command like the ones above).
	"deploy/image": 7,

	// Test harnesses and black-box tests sit above everything.
	"internal/testenv": 8, "internal/testenv/vmenv": 8, "internal/testenv/engineenv": 8, "internal/otlptest": 8, "internal/fakemessages": 8, "test/e2e": 8, "test/mcp": 8, "test/layers": 8,
	"test/claude": 8, "test/conformance": 8, "test/web": 8, "test/adversarial": 8, "test/cgroupv2": 8, "test/chaos": 8, "test/e2b": 8, "test/clients": 8,
	// The Helm chart's tests (deploy/helm) and the Kubernetes discovery harness.
	"deploy/helm": 8, "deploy/prometheus": 8, "internal/testenv/kubeenv": 8, "test/kubernetes/pause": 8, "test/kubernetes": 8,
}

// Front ends never import each other's internals: only pkg/apitypes, the
// engine and their own helpers. The agent's server side runs inside the
// sandbox and must not pull in the daemon.
var forbidden = map[string][]string{
	"pkg/mcpserver":     {"pkg/api", "pkg/e2b", "pkg/sshd"},
	"pkg/api":           {"pkg/mcpserver", "pkg/e2b", "pkg/sshd"},
	"pkg/e2b":           {"pkg/api", "pkg/mcpserver", "pkg/preview", "pkg/sshd"},
	"pkg/sshd":          {"pkg/api", "pkg/mcpserver", "pkg/preview", "pkg/e2b"},
	"pkg/api/client":    {"pkg/engine", "pkg/sandbox", "pkg/agent", "pkg/runtime", "pkg/store"},
	"pkg/sandbox":       {"pkg/sandbox/container", "pkg/runtime", "pkg/sandbox/qemu", "pkg/vm"},
	"pkg/agent/server":  {"pkg/sandbox", "pkg/engine", "pkg/store", "pkg/runtime", "pkg/config"},
	"cmd/sandbox-agent": {"pkg/sandbox", "pkg/engine", "pkg/store", "pkg/runtime", "pkg/config", "pkg/vm"},
	"cmd/sandboxctl":    {"pkg/engine", "pkg/sandbox", "pkg/runtime", "pkg/store"},
	// The point of sandbox-init is to start without the daemon's packages.
	"cmd/sandbox-init":   {"pkg/runtime", "pkg/engine", "pkg/sandbox", "pkg/config", "pkg/store", "pkg/seccomp"},
	"pkg/services/ports": {"pkg/engine"}, "pkg/services/snapshots": {"pkg/engine"}, "pkg/services/volumes": {"pkg/engine"},
	"pkg/services/images": {"pkg/engine"}, "pkg/services/agents": {"pkg/engine"},
	"pkg/services/pipeline": {"pkg/engine"}, "pkg/services/fixloop": {"pkg/engine"},
	"pkg/services":         {"pkg/engine"},
	"pkg/services/sshkeys": {"pkg/engine"}, "pkg/services/webhooks": {"pkg/engine"},
	// The gateway is stateless: it reaches sandboxes only through nodes.
	"pkg/gateway": {"pkg/engine", "pkg/store", "pkg/runtime", "pkg/mcpserver", "pkg/e2b"},
	// Nor does its MCP engine, which imports pkg/engine only for the types
	// pkg/mcpserver's interface names.
	"pkg/gateway/remote": {"pkg/store", "pkg/runtime", "pkg/api", "pkg/e2b", "pkg/sandbox/container", "pkg/services"},
}

func TestImportsPointDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}|{{join .Imports ","}}`, "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
		if !strings.HasPrefix(pkg, module) || strings.Contains(pkg, " ") || strings.HasSuffix(pkg, ".test") {
			continue // test variants ("pkg [pkg.test]") are checked through their package
		}
		p := strings.TrimSuffix(strings.TrimPrefix(pkg, module), "_test")
		if base := path.Base(p); base == "util" || base == "utils" || base == "common" || base == "helpers" {
			t.Errorf("%s: no util/common packages; name a package for what it is", p)
		}
		from, ok := layer[p]
		if !ok {
			t.Errorf("%s has no layer: give it one in test/layers (see docs/ARCHITECTURE.md)", p)
			continue
		}
		for _, imp := range strings.Split(imports, ",") {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			q := strings.TrimPrefix(imp, module)
			to, ok := layer[q]
			if !ok {
				continue // reported as its own line
			}
			if to > from {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down", p, from, q, to)
			}
			for _, f := range forbidden[p] {
				if q == f {
					t.Errorf("%s must not import %s", p, q)
				}
			}
		}
	}
}
