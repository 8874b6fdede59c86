package api

import (
	"net/http"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Preview ports (pkg/services/ports): POST exposes a port, GET lists the
// exposures, DELETE ends one.

func (s *server) routePorts(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/ports", s.exposePort)
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports", s.listPorts)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/ports/{port}", s.unexposePort)
}

func (s *server) exposePort(w http.ResponseWriter, r *http.Request) {
	var req engine.ExposePortRequest
	if err := s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	x, err := s.e.ExposePort(r.Context(), req)
	s.reply(w, r, http.StatusOK, x, err)
}

func (s *server) listPorts(w http.ResponseWriter, r *http.Request) {
	xs, err := s.e.Ports(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, apitypes.PortList{Ports: nonNil(xs)}, err)
}

func (s *server) unexposePort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, errdefs.Invalidf("port: %q is not a number", r.PathValue("port")))
		return
	}
	if err := s.e.UnexposePort(r.Context(), r.PathValue("id"), port); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
