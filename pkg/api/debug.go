package api

import (
	"net/http"
	"runtime/pprof"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Profiling the daemon: GET /v1/debug/pprof/{profile}, admin only (like
// Nomad's /v1/agent/pprof and Docker's debug endpoints). A CPU profile
// ("profile") or an execution trace ("trace") of the next `seconds`, or a
// snapshot of one of the runtime's named profiles; the answers are what
// `go tool pprof` and `go tool trace` read. The execution trace is what
// splits a REST call into wire, middleware, audit record and engine (the
// api.* and audit.append regions; docs/ARCHITECTURE.md, "Where run_code's
// and the front ends' time goes").
//
// Not net/http/pprof: importing it registers its handlers on
// http.DefaultServeMux as a side effect, and it answers bad input in
// plain text; these answer with the contract's error object and bound
// what they are asked.

// Bounds of a timed profile: what a caller asks for, and what it gets
// without asking.
const (
	maxProfileSeconds     = 60
	defaultProfileSeconds = 5
)

// namedProfiles are the runtime's profiles a snapshot may be taken of
// (runtime/pprof.Lookup); timedProfiles run for `seconds`.
var (
	namedProfiles = []string{"allocs", "block", "goroutine", "heap", "mutex", "threadcreate"}
	timedProfiles = []string{"profile", "trace"}
)

// debugProfile is GET /v1/debug/pprof/{profile}.
func (s *server) debugProfile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("profile")
	timed := slices.Contains(timedProfiles, name)
	if !timed && !slices.Contains(namedProfiles, name) {
		s.writeError(w, r, errdefs.NotFoundf("profile %q: want one of %v or %v", name, namedProfiles, timedProfiles))
		return
	}
	if !timed {
		debug, err := queryInt(r, "debug", 8)
		if err == nil && (debug < 0 || debug > 2) {
			err = errdefs.Invalidf("debug: want 0 (the binary format), 1 or 2 (text), got %d", debug)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if debug > 0 {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_ = pprof.Lookup(name).WriteTo(w, int(debug))
		return
	}
	secs := int64(defaultProfileSeconds)
	if v := r.URL.Query().Get("seconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > maxProfileSeconds {
			s.writeError(w, r, errdefs.Invalidf("seconds: want an integer from 1 to %d, got %q", maxProfileSeconds, v))
			return
		}
		secs = n
	}
	// The profile is written to the answer as it is made (a trace runs
	// to megabytes a second under load); headers go first, so a failure
	// to start is the only error the contract's object can carry.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	start, stop := pprof.StartCPUProfile, pprof.StopCPUProfile
	if name == "trace" {
		start, stop = rtrace.Start, rtrace.Stop
	}
	if err := start(w); err != nil {
		// The runtime runs one CPU profile and one trace at a time.
		w.Header().Del("Content-Disposition")
		s.writeError(w, r, errdefs.Conflictf("%s: %v (one at a time)", name, err))
		return
	}
	// The headers now, so a caller knows at once that its profile runs
	// (and another caller that it must wait).
	_ = http.NewResponseController(w).Flush()
	t := time.NewTimer(time.Duration(secs) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done(): // the caller left: stop at once
	}
	stop()
}
