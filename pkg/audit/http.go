package audit

import (
	"bufio"
	"context"
	"net"
	"net/http"
	rtrace "runtime/trace"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Call is what an HTTP front end learns about one request while it runs:
// its authentication layer names the principal (SetPrincipal) once it knows
// it; the middleware writes the record when the answer's status is sent.
type Call struct {
	mu     sync.Mutex
	who    principal.Principal
	hasWho bool
	origin principal.Origin
	target string
}

type callKey struct{}

// CallFrom returns the request's Call (nil outside the middleware).
func CallFrom(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

// SetPrincipal names who is calling. Safe on a nil Call.
func (c *Call) SetPrincipal(p principal.Principal) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.who, c.hasWho = p, true
	c.mu.Unlock()
}

// SetOrigin names the front end and the client's address when the
// authentication layer knows them better than the listener (the unix
// socket, a browser session). Safe on a nil Call.
func (c *Call) SetOrigin(o principal.Origin) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.origin = o
	c.mu.Unlock()
}

// SetTarget overrides the target the classifier found (e.g. the id of the
// sandbox a create made). Safe on a nil Call.
func (c *Call) SetTarget(t string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.target = t
	c.mu.Unlock()
}

// Classification is what a request is.
type Classification struct {
	Action, Target string
	// FrontEnd overrides the middleware's (e.g. /mcp on the REST listener).
	FrontEnd string
	// Changes is true for a request that changes anything: only those are
	// recorded, with every authentication failure.
	Changes bool
}

// Classifier classifies a request before it is served.
type Classifier func(r *http.Request) Classification

// HTTP wraps next, a front end's handler chain above its authentication:
// a request answered 401 is recorded as an authentication failure, and a
// request the classifier says changes something is recorded with its
// outcome. The record is appended — on disk — when the handler sends its
// status (or hijacks the connection), before any byte of the answer
// leaves. On a nil Log it returns next: no cost when the log is off.
func (l *Log) HTTP(frontEnd string, classify Classifier, next http.Handler) http.Handler {
	if l == nil {
		return next
	}
	return Middleware(l, frontEnd, classify, next)
}

// Appender stores a record durably before it returns: a *Log (files), or
// the fleet's audit rows (pkg/store/pgstore through a gateway).
type Appender interface {
	Append(rec Record) error
}

// Middleware is HTTP over any Appender: the gateway's front ends record
// into the fleet's rows what a daemon's record into its files.
func Middleware(l Appender, frontEnd string, classify Classifier, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &Call{}
		aw := &writer{ResponseWriter: w, l: l, r: r, c: c, frontEnd: frontEnd, classify: classify}
		next.ServeHTTP(aw, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
		aw.record(http.StatusOK) // a handler that wrote nothing answered 200
	})
}

// writer records the call on the answer's first status.
type writer struct {
	http.ResponseWriter
	l        Appender
	r        *http.Request
	c        *Call
	frontEnd string
	classify Classifier
	done     bool
}

func (w *writer) record(status int) {
	if w.done {
		return
	}
	w.done = true
	k := w.classify(w.r)
	action, target := k.Action, k.Target
	if status == http.StatusUnauthorized {
		action, target, k.Changes = ActionAuthenticate, w.r.Method+" "+w.r.URL.Path, true
	}
	if !k.Changes {
		return
	}
	w.c.mu.Lock()
	who, hasWho, o := w.c.who, w.c.hasWho, w.c.origin
	if w.c.target != "" {
		target = w.c.target
	}
	w.c.mu.Unlock()
	if !hasWho {
		who, _ = principal.From(w.r.Context())
	}
	if o == (principal.Origin{}) {
		o = principal.OriginFrom(w.r.Context())
	}
	fe, src := w.frontEnd, w.r.RemoteAddr
	if o.FrontEnd != "" {
		fe = o.FrontEnd
	}
	if k.FrontEnd != "" {
		fe = k.FrontEnd
	}
	if o.Source != "" {
		src = o.Source
	}
	rec := Record{
		KeyID: who.KeyID, KeyName: who.KeyName, Tenant: who.Tenant, Admin: who.Admin,
		FrontEnd: fe, Source: src, Action: action, Target: target, Outcome: Success, Status: status,
	}
	if status >= 400 {
		rec.Outcome, rec.Code = Failure, string(errhttp.CodeOf(status))
	}
	// An append that fails is logged and counted (Failures): the call has
	// happened, and refusing its answer would not undo it.
	defer rtrace.StartRegion(w.r.Context(), "audit.append").End()
	_ = w.l.Append(rec)
}

func (w *writer) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols {
		w.record(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *writer) Write(p []byte) (int, error) {
	w.record(http.StatusOK)
	return w.ResponseWriter.Write(p)
}

// Flush sends the status first (streams flush before their first line).
func (w *writer) Flush() {
	w.record(http.StatusOK)
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack records the call (a WebSocket upgrade) before handing the
// connection over.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.record(http.StatusSwitchingProtocols)
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
