package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// agentRun is agent_run: POST /v1/agent/run with an engine.AgentRunRequest;
// the answer is the AgentRunResult when the session ends. With
// ?stream=true it is NDJSON instead: a {"progress": AgentProgress} line per
// event as the session goes (started, tool_call, file_changed, text,
// result), then one {"result": AgentRunResult} line or {"error": ...}.
// Errors before the first event (bad input, no CLI in the image) keep
// their own status, as with the other streams.
func (s *server) agentRun(w http.ResponseWriter, r *http.Request) {
	var req engine.AgentRunRequest
	stream, err := s.decodeStreamable(w, r, &req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !stream {
		res, err := s.e.AgentRun(r.Context(), req, nil)
		s.reply(w, r, http.StatusOK, res, err)
		return
	}
	st := newNDJSONStream(w)
	res, err := s.e.AgentRun(r.Context(), req, func(p apitypes.AgentProgress) { st.send(agentLine{Progress: &p}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return agentLine{Error: &b} })
		return
	}
	st.send(agentLine{Result: res})
}

// agentLine is one line of the agent_run stream.
type agentLine = apitypes.AgentLine
