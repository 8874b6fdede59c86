package api

import (
	"encoding/json"
	"net/http"
	"sync"
)

// ndjsonStream writes a streamed answer (exec output, agent_run progress,
// the autofix loop's events, a VM's first-use build) as NDJSON lines, each
// flushed at once. The status (200) and headers go out with the first
// line, so that a request that fails before anything was streamed still
// gets a plain error answer with its own status (fail).
type ndjsonStream struct {
	mu      sync.Mutex // progress callbacks may come from several goroutines
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newNDJSONStream(w http.ResponseWriter) *ndjsonStream {
	return &ndjsonStream{w: w, rc: http.NewResponseController(w)}
}

// send writes v as one line. A write error means the client went away;
// the request's context is cancelled then, which ends the work behind it.
func (st *ndjsonStream) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the line types hold strings, numbers and API objects only
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.started {
		st.started = true
		st.w.Header().Set("Content-Type", "application/x-ndjson")
		st.w.Header().Set("X-Content-Type-Options", "nosniff")
		st.w.WriteHeader(http.StatusOK)
	}
	if _, err := st.w.Write(append(b, '\n')); err == nil {
		_ = st.rc.Flush()
	}
}

// hasStarted reports whether a line went out (the status is sent then).
func (st *ndjsonStream) hasStarted() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.started
}

// fail ends the stream with err: a plain error answer with its status when
// nothing was streamed yet, else a last line, line(the error's body).
func (st *ndjsonStream) fail(s *server, r *http.Request, err error, line func(errorBody) any) {
	if !st.hasStarted() {
		s.writeError(st.w, r, err)
		return
	}
	st.send(line(errorBodyOf(err)))
}
