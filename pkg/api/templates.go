package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Templates: POST /v1/templates (create), GET /v1/templates (list),
// GET and DELETE /v1/templates/{name}. Using one is POST /v1/sandboxes
// with template.

func (s *server) registerTemplates(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/templates", s.createTemplate)
	mux.HandleFunc("GET /v1/templates", s.listTemplates)
	mux.HandleFunc("GET /v1/templates/{name}", s.getTemplate)
	mux.HandleFunc("DELETE /v1/templates/{name}", s.deleteTemplate)
}

func (s *server) createTemplate(w http.ResponseWriter, r *http.Request) {
	var req apitypes.TemplateCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, err := s.e.CreateTemplate(r.Context(), req)
	s.reply(w, r, http.StatusCreated, t, err)
}

func (s *server) listTemplates(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListTemplates(r.Context())
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.e.GetTemplate(r.Context(), r.PathValue("name"))
	s.reply(w, r, http.StatusOK, t, err)
}

func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.e.DeleteTemplate(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
