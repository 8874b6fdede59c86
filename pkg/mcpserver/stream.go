package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// requestStream is the one ordered writer of one POST's answer. mcp-go
// delivers notifications through a channel that belongs to the MCP session,
// not to the request: with several calls in flight on one session, a
// request's progress can leave on another request's stream, after its own
// result (Claude Code then drops the connection: "progress notification for
// an unknown token"). So the tools do not use that channel for what belongs
// to a request: they write progress and heartbeats here, on the request's
// own response, and mcp-go writes the result through the same writer after
// the handler returned — which orders every notification before the result.
//
// Once this writer has started the SSE stream, an application/json answer
// mcp-go writes afterwards is turned into the stream's last SSE event.
type requestStream struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
	// accepts is whether the client takes text/event-stream answers.
	accepts bool
	// started: a status line went out; sse: as text/event-stream.
	started, sse bool
	// ours: this writer started the stream, so mcp-go's own headers go to
	// scratch and a JSON body it writes is held in held until it finished.
	ours    bool
	scratch http.Header
	held    bytes.Buffer
	closed  bool
}

type streamKey struct{}

// streamFrom returns the request's stream, or nil outside a streamable-HTTP
// POST.
func streamFrom(ctx context.Context) *requestStream {
	rs, _ := ctx.Value(streamKey{}).(*requestStream)
	return rs
}

var errNoStream = errors.New("the request's answer cannot carry notifications")

// withRequestStreams gives every POST its requestStream.
func withRequestStreams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		rs := &requestStream{w: w, rc: http.NewResponseController(w),
			accepts: strings.Contains(r.Header.Get("Accept"), "text/event-stream")}
		next.ServeHTTP(streamWriter{rs}, r.WithContext(context.WithValue(r.Context(), streamKey{}, rs)))
		rs.finish()
	})
}

// event writes one JSON-RPC message as an SSE event, starting the stream
// when nothing was written yet.
func (rs *requestStream) event(msg any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return rs.raw(fmt.Sprintf("event: message\ndata: %s\n\n", data))
}

// keepAlive writes an SSE comment, which clients ignore: it is the first
// byte that clients waiting for the response headers with a deadline
// (Claude Code: MCP_TOOL_TIMEOUT, default 60 s) need for a silent call.
func (rs *requestStream) keepAlive() error { return rs.raw(": still working\n\n") }

func (rs *requestStream) raw(s string) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.closed || !rs.accepts {
		return errNoStream
	}
	if !rs.started {
		h := rs.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		rs.w.WriteHeader(http.StatusOK)
		rs.started, rs.sse, rs.ours = true, true, true
		rs.scratch = http.Header{}
	}
	if !rs.sse {
		return errNoStream
	}
	if _, err := rs.w.Write([]byte(s)); err != nil {
		return err
	}
	return rs.rc.Flush()
}

// finish sends the JSON answer held back as the stream's last event.
func (rs *requestStream) finish() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	body := bytes.TrimSpace(rs.held.Bytes())
	if len(body) == 0 {
		return
	}
	var compact bytes.Buffer
	if json.Compact(&compact, body) != nil {
		return
	}
	_, _ = fmt.Fprintf(rs.w, "event: message\ndata: %s\n\n", compact.Bytes())
	_ = rs.rc.Flush()
}

// streamWriter is the ResponseWriter mcp-go writes through.
type streamWriter struct{ rs *requestStream }

func (s streamWriter) Header() http.Header {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	if s.rs.ours {
		return s.rs.scratch
	}
	return s.rs.w.Header()
}

func (s streamWriter) WriteHeader(code int) {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	s.writeHeader(code)
}

func (s streamWriter) writeHeader(code int) {
	if s.rs.started {
		return
	}
	s.rs.started = true
	s.rs.sse = strings.HasPrefix(s.rs.w.Header().Get("Content-Type"), "text/event-stream")
	s.rs.w.WriteHeader(code)
}

func (s streamWriter) Write(p []byte) (int, error) {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	if !s.rs.started {
		s.writeHeader(http.StatusOK)
	}
	if s.rs.ours && !strings.HasPrefix(s.rs.scratch.Get("Content-Type"), "text/event-stream") {
		// mcp-go answers with JSON, not knowing the stream began: hold it
		// for finish.
		return s.rs.held.Write(p)
	}
	return s.rs.w.Write(p)
}

func (s streamWriter) Flush() {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	if !s.rs.started {
		s.writeHeader(http.StatusOK)
	}
	_ = s.rs.rc.Flush()
}

func (s streamWriter) Unwrap() http.ResponseWriter { return s.rs.w }
