package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// VMs (/v1/vms): a VM is a sandbox run by the VM backend, so exec and
// files are the sandbox handlers behind a check that the id is a running
// VM; what only VMs have (snapshots, screenshots, vm_test) has its own.
func (s *server) vmRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/vms", s.createVM)
	mux.HandleFunc("GET /v1/vms", s.listVMs)
	mux.HandleFunc("POST /v1/vms/test", s.vmTest)
	mux.HandleFunc("GET /v1/vms/{id}", s.getVM)
	mux.HandleFunc("DELETE /v1/vms/{id}", s.destroyVM)
	mux.HandleFunc("POST /v1/vms/{id}/exec", s.liveVMOnly(s.vmExec))
	mux.HandleFunc("PUT /v1/vms/{id}/files", s.liveVMOnly(s.vmWriteFile))
	mux.HandleFunc("GET /v1/vms/{id}/files", s.liveVMOnly(s.vmReadFile))
	mux.HandleFunc("GET /v1/vms/{id}/snapshots", s.listVMSnapshots)
	mux.HandleFunc("POST /v1/vms/{id}/snapshots", s.snapshotVM)
	mux.HandleFunc("POST /v1/vms/{id}/restore", s.restoreVM)
	mux.HandleFunc("GET /v1/vms/{id}/screenshot", s.screenshotVM)
}

// liveVMOnly runs a sandbox handler for a running VM's id only.
func (s *server) liveVMOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.e.CheckLiveVM(r.Context(), r.PathValue("id")); err != nil {
			s.writeError(w, r, err)
			return
		}
		h(w, r)
	}
}

// createVM starts a VM. With ?stream=true the answer is NDJSON: {"log":
// line} for each progress line (a guest image built on first use, a disk
// guest booting), then {"vm": ...} or {"error": ...}; the status (200) is
// sent with the first line, so an error before any keeps its own status.
func (s *server) createVM(w http.ResponseWriter, r *http.Request) {
	var req apitypes.VMCreateRequest
	stream, err := s.decodeStreamable(w, r, &req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !stream {
		v, err := s.e.CreateVM(r.Context(), req, nil)
		s.reply(w, r, http.StatusCreated, v, err)
		return
	}
	st := newNDJSONStream(w)
	v, err := s.e.CreateVM(r.Context(), req, func(line string) { st.send(vmCreateLine{Log: line}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return vmCreateLine{Error: &b} })
		return
	}
	st.send(vmCreateLine{VM: v})
}

// vmCreateLine is one line of the vm create stream (client.VMCreateLine on
// the other side).
type vmCreateLine struct {
	Log   string       `json:"log,omitempty"`
	VM    *apitypes.VM `json:"vm,omitempty"`
	Error *errorBody   `json:"error,omitempty"`
}

// vmExec is exec on a VM: through qemu-ga on a guest that runs only that
// (engine.VMExec), else the sandbox exec.
func (s *server) vmExec(w http.ResponseWriter, r *http.Request) {
	s.execWith(w, r, func(ctx context.Context, req engine.ExecRequest, out sandbox.OutputFunc) (*sandbox.ExecResult, error) {
		return s.e.VMExec(ctx, apitypes.VMExecRequest{VMID: req.SandboxID, Command: req.Command, Argv: req.Argv, Cwd: req.Cwd,
			Env: req.Env, Stdin: req.Stdin, TimeoutSeconds: req.TimeoutSeconds, MaxOutputBytes: req.MaxOutputBytes}, out)
	})
}

// vmWriteFile uploads a file into a VM (engine.VMWriteFileFrom).
func (s *server) vmWriteFile(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength < 0 {
		s.writeError(w, r, errdefs.Invalidf("Content-Length: required (uploads of unknown length are not supported)"))
		return
	}
	res, err := s.e.VMWriteFileFrom(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), r.URL.Query().Get("mode"), r.ContentLength, r.Body)
	s.reply(w, r, http.StatusOK, res, err)
}

// vmReadFile downloads a file of a VM (engine.VMReadFileRaw); listing is
// the sandbox's (our guests only).
func (s *server) vmReadFile(w http.ResponseWriter, r *http.Request) {
	s.readFileWith(w, r, s.e.VMReadFileRaw)
}

type vmList struct {
	VMs []*apitypes.VM `json:"vms"`
}

func (s *server) listVMs(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListVMs(r.Context(), r.URL.Query().Get("state"))
	s.reply(w, r, http.StatusOK, vmList{VMs: nonNil(l)}, err)
}

func (s *server) getVM(w http.ResponseWriter, r *http.Request) {
	v, err := s.e.GetVM(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, v, err)
}

func (s *server) destroyVM(w http.ResponseWriter, r *http.Request) {
	v, err := s.e.DestroyVM(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, v, err)
}

type vmSnapshotList struct {
	Snapshots []string `json:"snapshots"`
}

func (s *server) listVMSnapshots(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.e.CheckLiveVM(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.e.GetVM(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, vmSnapshotList{Snapshots: nonNil(v.Snapshots)})
}

// decodeSnapshot reads a snapshot request whose VM is the one in the path.
func (s *server) decodeSnapshot(w http.ResponseWriter, r *http.Request) (apitypes.VMSnapshotRequest, error) {
	var req apitypes.VMSnapshotRequest
	return req, s.decodeFor(w, r, &req, "vm_id", &req.VMID)
}

func (s *server) snapshotVM(w http.ResponseWriter, r *http.Request) {
	req, err := s.decodeSnapshot(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.SnapshotVM(r.Context(), req)
	s.reply(w, r, http.StatusCreated, res, err)
}

func (s *server) restoreVM(w http.ResponseWriter, r *http.Request) {
	req, err := s.decodeSnapshot(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.RestoreVM(r.Context(), req)
	s.reply(w, r, http.StatusOK, res, err)
}

func (s *server) screenshotVM(w http.ResponseWriter, r *http.Request) {
	png, err := s.e.ScreenshotVM(r.Context(), r.PathValue("id"))
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
