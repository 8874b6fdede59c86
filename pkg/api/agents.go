package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// agentRun is agent_run: POST /v1/agent/run with an engine.AgentRunRequest;
// the answer is the AgentRunResult when the session ends.
func (s *server) agentRun(w http.ResponseWriter, r *http.Request) {
	var req engine.AgentRunRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.e.AgentRun(r.Context(), req, nil)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
