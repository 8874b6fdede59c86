package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// startJob runs a command in the background (exec_command with background: true).
func (s *server) startJob(w http.ResponseWriter, r *http.Request) {
	req, err := s.decodeExec(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	jobID, err := s.e.StartJob(r.Context(), req)
	s.reply(w, r, http.StatusAccepted, apitypes.JobStarted{JobID: jobID}, err)
}

func (s *server) listJobs(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.e.ListJobs(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, apitypes.JobList{Jobs: nonNil(jobs)}, err)
}

// jobStatus pages a job's output: ?stdout_offset=&stderr_offset=&max_bytes=.
func (s *server) jobStatus(w http.ResponseWriter, r *http.Request) {
	req := engine.JobStatusRequest{SandboxID: r.PathValue("id"), JobID: r.PathValue("job")}
	var err error
	if req.StdoutOffset, err = queryInt(r, "stdout_offset", 64); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.StderrOffset, err = queryInt(r, "stderr_offset", 64); err != nil {
		s.writeError(w, r, err)
		return
	}
	max, err := queryInt(r, "max_bytes", 32)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.MaxBytes = int(max)
	st, err := s.e.JobStatus(r.Context(), req)
	s.reply(w, r, http.StatusOK, st, err)
}

// killJob signals a job: ?signal=SIGTERM (default SIGKILL), and says its
// state after a short wait for it to end.
func (s *server) killJob(w http.ResponseWriter, r *http.Request) {
	res, err := s.e.KillJob(r.Context(), apitypes.JobKillRequest{
		SandboxID: r.PathValue("id"), JobID: r.PathValue("job"), Signal: r.URL.Query().Get("signal")})
	s.reply(w, r, http.StatusOK, res, err)
}
