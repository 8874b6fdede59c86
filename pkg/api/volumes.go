package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Named volumes: POST /v1/volumes (create), GET /v1/volumes (list),
// GET and DELETE /v1/volumes/{name}. Mounting is POST /v1/sandboxes with
// volumes.

func (s *server) registerVolumes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/volumes", s.createVolume)
	mux.HandleFunc("GET /v1/volumes", s.listVolumes)
	mux.HandleFunc("GET /v1/volumes/{name}", s.getVolume)
	mux.HandleFunc("DELETE /v1/volumes/{name}", s.deleteVolume)
}

func (s *server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req apitypes.VolumeCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.e.CreateVolume(r.Context(), req)
	s.reply(w, r, http.StatusCreated, v, err)
}

func (s *server) listVolumes(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListVolumes(r.Context())
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.e.GetVolume(r.Context(), r.PathValue("name"))
	s.reply(w, r, http.StatusOK, v, err)
}

func (s *server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.e.DeleteVolume(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
