package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// API keys: GET and POST /v1/keys, POST /v1/keys/{id}/revoke and
// /v1/keys/{id}/rotate (admin keys and the socket only: adminOnly, and the
// engine again), GET /v1/keys/{id}/usage (an admin: any key; a user key:
// its own, "self" naming it).

func (s *server) routeKeys(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/keys", s.listKeys)
	mux.HandleFunc("POST /v1/keys", s.createKey)
	mux.HandleFunc("POST /v1/keys/{id}/revoke", s.revokeKey)
	mux.HandleFunc("POST /v1/keys/{id}/rotate", s.rotateKey)
	mux.HandleFunc("GET /v1/keys/{id}/usage", s.keyUsage)
}

func (s *server) listKeys(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListKeys(r.Context())
	if l == nil {
		l = []apitypes.Key{}
	}
	s.reply(w, r, http.StatusOK, apitypes.KeyList{Keys: l}, err)
}

func (s *server) createKey(w http.ResponseWriter, r *http.Request) {
	var req apitypes.KeyCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	k, err := s.e.CreateKey(r.Context(), req)
	s.reply(w, r, http.StatusCreated, k, err)
}

func (s *server) revokeKey(w http.ResponseWriter, r *http.Request) {
	k, err := s.e.RevokeKey(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, k, err)
}

func (s *server) rotateKey(w http.ResponseWriter, r *http.Request) {
	k, err := s.e.RotateKey(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, k, err)
}

func (s *server) keyUsage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == "self" {
		id = ""
	}
	u, err := s.e.KeyUsage(r.Context(), id)
	s.reply(w, r, http.StatusOK, u, err)
}
