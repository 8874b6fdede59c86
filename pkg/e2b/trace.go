package e2b

import (
	"net/http"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TraceRoute names a request's span (pkg/telemetry) by what it is, never
// by its raw path, so that a client cannot mint span names: an envd RPC by
// its procedure ("envd /process.Process/Start"), a control-plane call by
// its route template ("POST /sandboxes/{id}/timeout"), a relayed request
// by its method.
func (s *Server) TraceRoute(r *http.Request) string {
	_, port, routed := s.route(r)
	if routed {
		if port != EnvdPort {
			return r.Method + " relay"
		}
		if envdRoutes()[r.URL.Path] {
			return "envd " + r.URL.Path
		}
		return "envd " + r.Method + " (unmatched)"
	}
	return r.Method + " " + controlRoute(r.URL.Path)
}

// controlRoutes are the control plane's paths with the sandbox id as {id}.
var controlRoutes = map[string]bool{
	"/sandboxes": true, "/v2/sandboxes": true, "/sandboxes/{id}": true, "/sandboxes/{id}/timeout": true,
	"/sandboxes/{id}/refreshes": true, "/sandboxes/{id}/pause": true, "/sandboxes/{id}/connect": true,
	"/v2/sandboxes/{id}/connect": true, "/sandboxes/{id}/resume": true, "/sandboxes/{id}/metrics": true,
	"/templates": true, "/health": true,
}

func controlRoute(p string) string {
	parts := strings.Split(p, "/")
	for i := 1; i < len(parts); i++ {
		if parts[i-1] == "sandboxes" {
			parts[i] = "{id}"
			break
		}
	}
	if t := strings.Join(parts, "/"); controlRoutes[t] {
		return t
	}
	return "(unmatched)"
}

// envdRoutes are the paths of envd: every procedure of its Connect
// services (from their registered descriptors, so a new RPC is named
// without a list to keep) and its plain HTTP routes.
var envdRoutes = sync.OnceValue(func() map[string]bool {
	m := map[string]bool{"/files": true, "/health": true}
	for _, svc := range []protoreflect.FullName{"process.Process", "filesystem.Filesystem"} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(svc)
		if err != nil {
			continue
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			m["/"+string(svc)+"/"+string(methods.Get(i).Name())] = true
		}
	}
	return m
})
