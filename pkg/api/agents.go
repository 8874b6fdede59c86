package api

import (
	"encoding/json"
	"net/http"
	"sync"

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
	stream, err := queryBool(r, "stream")
	if err == nil {
		err = s.decodeJSON(w, r, &req)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !stream {
		res, err := s.e.AgentRun(r.Context(), req, nil)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
		return
	}
	st := &agentStream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	res, err := s.e.AgentRun(r.Context(), req, func(p apitypes.AgentProgress) { st.send(agentLine{Progress: &p}) })
	switch {
	case err != nil && !st.started:
		s.writeError(w, r, err)
	case err != nil:
		body := errorBodyOf(err)
		st.send(agentLine{Error: &body})
	default:
		st.send(agentLine{Result: res})
	}
}

// agentLine is one line of the agent_run stream (client.AgentLine on the
// other side).
type agentLine struct {
	Progress *apitypes.AgentProgress  `json:"progress,omitempty"`
	Result   *apitypes.AgentRunResult `json:"result,omitempty"`
	Error    *errorBody               `json:"error,omitempty"`
}

// agentStream writes the NDJSON lines, each flushed at once.
type agentStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
}

func (st *agentStream) send(l agentLine) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.started {
		st.started = true
		st.w.Header().Set("Content-Type", "application/x-ndjson")
		st.w.Header().Set("X-Content-Type-Options", "nosniff")
		st.w.WriteHeader(http.StatusOK)
	}
	// A write error means the client went away; the request's context is
	// cancelled then, which ends the session.
	if st.enc.Encode(l) == nil {
		_ = st.rc.Flush()
	}
}
