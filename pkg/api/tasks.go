package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// runTask is run_task: POST /v1/sandboxes/{id}/tasks with a RunTaskRequest
// whose sandbox is the one in the path; the answer is the task's
// ExecResult once it ended. It is what the gateway's MCP engine
// (pkg/gateway/remote) calls for the tool, so that the task's definition
// stays on the node.
func (s *server) runTask(w http.ResponseWriter, r *http.Request) {
	var req apitypes.RunTaskRequest
	if err := s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.RunTask(r.Context(), req)
	s.reply(w, r, http.StatusOK, res, err)
}

// packagesInstall is packages_install: POST /v1/sandboxes/{id}/packages
// with a PackagesInstallRequest whose sandbox is the one in the path; the
// answer is the installation's ExecResult (see runTask).
func (s *server) packagesInstall(w http.ResponseWriter, r *http.Request) {
	var req apitypes.PackagesInstallRequest
	if err := s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.PackagesInstall(r.Context(), req)
	s.reply(w, r, http.StatusOK, res, err)
}
