package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// replayRun is run_replay: POST /v1/runs/{id}/replay, no body. The answer
// is a RunReplay: the new run's result and its diff against the original.
// Served when Options.Replays is set.
func (s *server) replayRun(w http.ResponseWriter, r *http.Request) {
	res, err := s.opt.Replays.ReplayRun(r.Context(), apitypes.RunReplayRequest{RunID: r.PathValue("id")})
	s.reply(w, r, http.StatusOK, res, err)
}
