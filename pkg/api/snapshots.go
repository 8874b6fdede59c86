package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Workspace snapshots: POST /v1/sandboxes/{id}/snapshots (take),
// POST /v1/sandboxes/{id}/restore (roll back), GET /v1/snapshots[?sandbox_id=],
// GET and DELETE /v1/snapshots/{id}. Forks are POST /v1/sandboxes with
// from_snapshot.

func (s *server) registerSnapshots(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.snapshotSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/restore", s.restoreSandbox)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	mux.HandleFunc("GET /v1/snapshots/{id}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
}

func (s *server) snapshotSandbox(w http.ResponseWriter, r *http.Request) {
	var req apitypes.SnapshotRequest
	if r.ContentLength != 0 { // the body is optional: {"name": ...}
		if err := s.decodeJSON(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if err := pathID(r, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	snap, err := s.e.SnapshotSandbox(r.Context(), req)
	s.reply(w, r, http.StatusCreated, snap, err)
}

func (s *server) restoreSandbox(w http.ResponseWriter, r *http.Request) {
	var req apitypes.RestoreRequest
	if err := s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.e.RestoreSandbox(r.Context(), req)
	s.reply(w, r, http.StatusOK, info, err)
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList = apitypes.SnapshotList

func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListSnapshots(r.Context(), r.URL.Query().Get("sandbox_id"))
	s.reply(w, r, http.StatusOK, SnapshotList{Snapshots: l}, err)
}

func (s *server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.e.GetSnapshot(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, snap, err)
}

func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.e.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
