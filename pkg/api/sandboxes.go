package api

import (
	"context"
	"encoding/base64"
	"net/http"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// createSandbox creates a sandbox; with ?stream=true the answer is NDJSON
// with progress lines (createSandboxStream).
func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req engine.CreateSandboxRequest
	stream, err := s.decodeStreamable(w, r, &req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if stream {
		s.createSandboxStream(w, r, req)
		return
	}
	info, err := s.e.CreateSandbox(r.Context(), req)
	auditCreated(r, info, err)
	s.reply(w, r, http.StatusCreated, info, err)
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.ListSandboxes(r.Context(), r.URL.Query().Get("state"))
	out := apitypes.SandboxList{Sandboxes: make([]apitypes.Sandbox, 0, len(l)), Total: len(l)}
	for _, sb := range l {
		out.Sandboxes = append(out.Sandboxes, *sb)
	}
	s.reply(w, r, http.StatusOK, out, err)
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	d, err := s.e.GetSandbox(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, d, err)
}

func (s *server) terminateSandbox(w http.ResponseWriter, r *http.Request) {
	info, err := s.e.TerminateSandbox(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, info, err)
}

func (s *server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	info, err := s.e.PauseSandbox(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, info, err)
}

func (s *server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	info, err := s.e.ResumeSandbox(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, info, err)
}

// decodeExec reads an exec request whose sandbox is the one in the path.
func (s *server) decodeExec(w http.ResponseWriter, r *http.Request) (engine.ExecRequest, error) {
	var req engine.ExecRequest
	return req, s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID)
}

// pathID puts the path's id into a body's field, refusing a different one.
func pathID(r *http.Request, field string, body *string) error {
	id := r.PathValue("id")
	if *body != "" && *body != id {
		return errdefs.Invalidf("%s: %q in the body contradicts %q in the path", field, *body, id)
	}
	*body = id
	return nil
}

// decodeFor reads a request body into v whose id field (named field in
// messages) is the resource in the path.
func (s *server) decodeFor(w http.ResponseWriter, r *http.Request, v any, field string, id *string) error {
	if err := s.decodeJSON(w, r, v); err != nil {
		return err
	}
	return pathID(r, field, id)
}

// exec runs a command and streams its output as NDJSON. The status line is
// sent with the first line of output, so that errors the engine reports
// before the command produced anything (unknown sandbox, invalid request)
// still get their own HTTP status; after that, an error can only be a last
// {"error": ...} line.
func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	s.execWith(w, r, s.e.Exec)
}

// execWith is exec with run running the command (a VM's: see vmExec).
func (s *server) execWith(w http.ResponseWriter, r *http.Request, run func(context.Context, engine.ExecRequest, sandbox.OutputFunc) (*sandbox.ExecResult, error)) {
	req, err := s.decodeExec(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st := &execStream{ndjsonStream: newNDJSONStream(w)}
	// Cancelling the request (the client went away) kills the command.
	res, err := run(r.Context(), req, st.output)
	if err != nil {
		if st.hasStarted() && errdefs.CodeOf(err) == errdefs.Internal {
			s.log.Error("exec failed", "sandbox", req.SandboxID, "err", err)
		}
		st.fail(s, r, err, func(b errorBody) any { return execLine{Error: &b} })
		return
	}
	st.flush()
	st.send(exitLine(res))
}

// exitLine ends an exec stream with the command's outcome, without its
// output, which went out in the stream lines already.
func exitLine(res *apitypes.ExecResult) execLine {
	return execLine{Exit: apitypes.NewExecExit(res)}
}

// execLine is one line of the exec stream.
type execLine = apitypes.ExecLine

// execStream writes the exec NDJSON stream. Output chunks are cut anywhere,
// also inside a multi-byte character: the incomplete tail of a chunk is held
// back until the next chunk of its stream completes it, so that text stays
// text; output that is not UTF-8 at all goes out base64-encoded, byte-exact.
type execStream struct {
	*ndjsonStream
	pending map[string][]byte
}

func (st *execStream) output(stream string, data []byte) {
	if p := st.pending[stream]; len(p) > 0 {
		data = append(p, data...)
		st.pending[stream] = nil
	}
	if n := incompleteRune(data); n > 0 {
		if st.pending == nil {
			st.pending = map[string][]byte{}
		}
		st.pending[stream] = append([]byte(nil), data[len(data)-n:]...)
		data = data[:len(data)-n]
	}
	st.chunk(stream, data)
}

// flush sends what output is held back at the end of the command.
func (st *execStream) flush() {
	for _, stream := range []string{"stdout", "stderr"} {
		st.chunk(stream, st.pending[stream])
	}
	st.pending = nil
}

func (st *execStream) chunk(stream string, data []byte) {
	switch {
	case len(data) == 0:
	case utf8.Valid(data):
		st.send(execLine{Stream: stream, Data: string(data)})
	default:
		st.send(execLine{Stream: stream, Data: base64.StdEncoding.EncodeToString(data), Encoding: "base64"})
	}
}

// incompleteRune returns the length of the UTF-8 sequence that p ends in the
// middle of (0 when p ends on a character boundary).
func incompleteRune(p []byte) int {
	for n := 1; n < utf8.UTFMax && n <= len(p); n++ {
		b := p[len(p)-n]
		if utf8.RuneStart(b) {
			if b >= utf8.RuneSelf && !utf8.FullRune(p[len(p)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

// sandboxNetwork reports (GET) or changes (PUT, body {mode, allow}) a
// sandbox's network policy, with its counters.
func (s *server) sandboxNetwork(w http.ResponseWriter, r *http.Request) {
	var req engine.SandboxNetworkRequest
	if r.Method == http.MethodPut {
		if err := s.decodeJSON(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
		if req.Mode == "" && req.Allow == nil {
			s.writeError(w, r, errdefs.Invalidf("mode: required (egress or allowlist)"))
			return
		}
	}
	if err := pathID(r, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.e.SandboxNetwork(r.Context(), req)
	s.reply(w, r, http.StatusOK, st, err)
}
