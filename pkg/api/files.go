package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// writeFile uploads the raw request body to ?path= (mode= octal, append=).
// The engine needs the exact size before the first byte, so the request must
// carry a Content-Length.
func (s *server) writeFile(w http.ResponseWriter, r *http.Request) {
	appendTo, err := queryBool(r, "append")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.ContentLength < 0 {
		s.writeError(w, r, errdefs.Invalidf("Content-Length: required (uploads of unknown length are not supported)"))
		return
	}
	res, err := s.e.WriteFileFrom(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), r.URL.Query().Get("mode"), appendTo, r.ContentLength, r.Body)
	s.reply(w, r, http.StatusOK, res, err)
}

// readFile downloads ?path= as raw bytes (offset= and max_bytes= page through
// it), or with list=true lists it as a directory (recursive=).
func (s *server) readFile(w http.ResponseWriter, r *http.Request) {
	s.readFileWith(w, r, s.e.ReadFileRaw)
}

// readFileWith is readFile with read reading the file (a VM's: see
// vmReadFile).
func (s *server) readFileWith(w http.ResponseWriter, r *http.Request, read func(context.Context, engine.FileReadRequest) (*agent.FileData, error)) {
	list, err := queryBool(r, "list")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list {
		s.listFiles(w, r)
		return
	}
	offset, err := queryInt(r, "offset", 64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	maxBytes, err := queryInt(r, "max_bytes", 64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if maxBytes == 0 {
		maxBytes = engine.MaxFileBytes
	}
	d, err := read(r.Context(), engine.FileReadRequest{
		SandboxID: r.PathValue("id"), Path: r.URL.Query().Get("path"), Offset: offset, MaxBytes: maxBytes,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.Itoa(len(d.Data)))
	h.Set("X-File-Size", strconv.FormatInt(d.Size, 10))
	h.Set("X-File-Truncated", strconv.FormatBool(d.Truncated))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(d.Data) // the status is sent; a failed write means the client went away
}

func (s *server) listFiles(w http.ResponseWriter, r *http.Request) {
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	max, err := queryInt(r, "max_entries", 32)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	l, err := s.e.ListFilesPage(r.Context(), apitypes.FileListRequest{SandboxID: r.PathValue("id"),
		Path: r.URL.Query().Get("path"), Recursive: recursive, MaxEntries: int(max)})
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) deleteFile(w http.ResponseWriter, r *http.Request) {
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.DeleteFile(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), recursive)
	s.reply(w, r, http.StatusOK, res, err)
}
