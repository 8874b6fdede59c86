package api

import (
	"io"
	"net/http"
	"strconv"
)

// exportFiles is files_export: POST /v1/sandboxes/{id}/export?path=DIR packs
// DIR (default /workspace) into an artifact.
func (s *server) exportFiles(w http.ResponseWriter, r *http.Request) {
	art, err := s.e.ExportFiles(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"))
	s.reply(w, r, http.StatusCreated, art, err)
}

// downloadArtifact streams an artifact: GET /v1/artifacts/{id} (HEAD: its
// headers only).
func (s *server) downloadArtifact(w http.ResponseWriter, r *http.Request) {
	art, f, err := s.e.OpenArtifact(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Length", strconv.FormatInt(art.Size, 10))
	w.Header().Set("Content-Disposition", `attachment; filename="`+art.ID+`.tar.gz"`)
	w.Header().Set("X-Artifact-SHA256", art.SHA256)
	if r.Method == http.MethodHead {
		// A gateway finding the node that holds it: no body to send.
		return
	}
	if _, err := io.Copy(w, f); err != nil {
		s.log.Warn("artifact download interrupted", "artifact", art.ID, "err", err)
	}
}
