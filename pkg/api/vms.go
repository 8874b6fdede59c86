package api

import (
	"net/http"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// VMs are sandboxes (POST /v1/sandboxes {backend: vm}) and every
// /v1/sandboxes route works on them as far as their capabilities go. What
// only a screen or a guest boot can do has a route of its own: the
// screenshot of any sandbox with a screen, and vm_test.
func (s *server) vmRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/screenshot", s.screenshot)
	mux.HandleFunc("POST /v1/vm-test", s.vmTest)
}

// createSandboxStream creates a sandbox answering NDJSON: {"log": line}
// for each progress line (a VM's guest image built on first use, a disk
// guest booting), then {"sandbox": ...} or {"error": ...}; the status
// (200) is sent with the first line, so an error before any keeps its own
// status.
func (s *server) createSandboxStream(w http.ResponseWriter, r *http.Request, req engine.CreateSandboxRequest) {
	st := newNDJSONStream(w)
	info, err := s.e.CreateSandboxProgress(r.Context(), req, func(line string) { st.send(apitypes.CreateLine{Log: line}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return apitypes.CreateLine{Error: &b} })
		return
	}
	st.send(apitypes.CreateLine{Sandbox: info})
}

func (s *server) screenshot(w http.ResponseWriter, r *http.Request) {
	png, err := s.e.ScreenshotSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", strconv.Itoa(len(png)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(png)
}

func (s *server) vmTest(w http.ResponseWriter, r *http.Request) {
	var req apitypes.VMTestRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.VMTest(r.Context(), req)
	s.reply(w, r, http.StatusOK, res, err)
}
