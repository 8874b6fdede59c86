package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// healthz answers while the process serves (liveness); readiness is /readyz.
func (s *server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, apitypes.Health{Status: "ok", Version: version.Version, UptimeS: s.e.Uptime().Seconds()})
}

// readyz runs the engine's readiness checks: 503 while a required one fails.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := s.e.Readiness(r.Context())
	if engine.Ready(checks) {
		writeJSON(w, http.StatusOK, apitypes.Readiness{Status: apitypes.StatusReady, Checks: checks})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, apitypes.Readiness{Status: apitypes.StatusNotReady, Checks: checks})
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	st, err := s.e.Status(r.Context())
	s.reply(w, r, http.StatusOK, st, err)
}

// nodeStatus is GET /v1/node: capacity and usage for gateways' placement.
func (s *server) nodeStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.e.NodeStatus(r.Context())
	s.reply(w, r, http.StatusOK, st, err)
}

// nodeDrain is PUT /v1/node/drain: start or end a drain.
func (s *server) nodeDrain(w http.ResponseWriter, r *http.Request) {
	var req apitypes.NodeDrainRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.e.SetDraining(r.Context(), req.Draining)
	s.reply(w, r, http.StatusOK, st, err)
}

type imageList struct {
	Images []apitypes.Image `json:"images"`
}

// images is image_list: GET /v1/images.
func (s *server) images(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ImageList(r.Context())
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) gc(w http.ResponseWriter, r *http.Request) {
	rep, err := s.e.GC(r.Context())
	s.reply(w, r, http.StatusOK, rep, err)
}

// nonNil makes empty lists encode as [] rather than null.
func nonNil[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}
