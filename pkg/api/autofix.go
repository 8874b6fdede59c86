package api

import (
	"encoding/json"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// autofixLine is one line of the /v1/autofix NDJSON stream: an attempt or
// a fix as it happens (type attempt, fix), then the loop's answer (type
// result) or the error that ended it (type error).
type autofixLine = apitypes.AutofixLine

// autofixStream writes the loop's events as NDJSON. A request refused
// before the loop starts gets a plain error response with its status.
type autofixStream struct {
	*ndjsonStream
	s *server
	r *http.Request
}

func (s *server) newAutofixStream(w http.ResponseWriter, r *http.Request) *autofixStream {
	return &autofixStream{ndjsonStream: newNDJSONStream(w), s: s, r: r}
}

func (st *autofixStream) options() engine.AutofixOptions {
	return engine.AutofixOptions{OnEvent: func(ev apitypes.AutofixEvent) {
		if ev.Type != "result" { // the final line carries the answer
			st.send(autofixLine{AutofixEvent: ev})
		}
	}}
}

func (st *autofixStream) finish(res *apitypes.AutofixResult, err error) {
	if err != nil {
		st.fail(st.s, st.r, err, func(b errorBody) any {
			return autofixLine{AutofixEvent: apitypes.AutofixEvent{Type: "error"}, Error: &b}
		})
		return
	}
	st.send(autofixLine{AutofixEvent: apitypes.AutofixEvent{Type: "result", AutofixID: res.AutofixID, RunID: res.RunID, Result: res}})
}

// autofix is POST /v1/autofix with an AutofixRequest: the loop, streamed.
func (s *server) autofix(w http.ResponseWriter, r *http.Request) {
	var req engine.AutofixRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st := s.newAutofixStream(w, r)
	res, err := s.e.Autofix(r.Context(), req, st.options())
	st.finish(res, err)
}

// autofixSubmit is POST /v1/autofix/{id}/submit with the client's fix.
func (s *server) autofixSubmit(w http.ResponseWriter, r *http.Request) {
	var req engine.AutofixSubmitRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	req.AutofixID = r.PathValue("id")
	st := s.newAutofixStream(w, r)
	res, err := s.e.AutofixSubmit(r.Context(), req, st.options())
	st.finish(res, err)
}

// autofixStatus is GET /v1/autofix/{id}.
func (s *server) autofixStatus(w http.ResponseWriter, r *http.Request) {
	res, err := s.e.AutofixStatus(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, res, err)
}

// exportRuns is GET /v1/runs/export?format=jsonl: the autofix corrections
// as JSON lines.
func (s *server) exportRuns(w http.ResponseWriter, r *http.Request) {
	if f := r.URL.Query().Get("format"); f != "" && f != "jsonl" {
		s.writeError(w, r, errdefs.Invalidf("format: only jsonl, got %q", f))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	err := s.e.ExportCorrections(r.Context(), func(c apitypes.CorrectionRecord) error { return enc.Encode(c) })
	if err != nil {
		s.log.Warn("runs export", "err", err)
	}
}
