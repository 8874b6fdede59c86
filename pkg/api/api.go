// Package api serves SandboxRunner's REST API (docs/SPEC.md "REST API"): JSON
// resources over pkg/engine, NDJSON streams for command output, WebSockets
// for terminals and events, and the /healthz, /readyz and /metrics endpoints.
//
// Handlers are thin adapters: they decode the request, call one engine
// method and encode its answer. The engine validates every field and returns
// errors from the pkg/errdefs taxonomy, which writeError maps to HTTP in one
// place. The same handler serves the daemon's unix socket (no token: the
// socket's file mode is the access control) and its TCP address (bearer
// token or a web editor session on every route but /healthz: auth.go), and
// the web editor's page (ui.go).
package api

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	rtrace "runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// DefaultMaxBodyBytes caps JSON request bodies unless Options say otherwise.
const DefaultMaxBodyBytes = 1 << 20

// Options configure the handler.
type Options struct {
	// Auth authenticates bearer keys (pkg/tenants: API keys, the token
	// file's key) on every route but /healthz and /login. Nil with Token
	// empty means no authentication (the unix socket: principal.Socket).
	Auth Authenticator
	// Token, when Auth is nil, is the one bearer token accepted, as an
	// admin (tests and embedders without a key store).
	Token string
	// Log receives one debug line per request and the details of internal
	// errors; nil means slog.Default().
	Log *slog.Logger
	// MaxBodyBytes caps JSON request bodies and MCP requests (default
	// DefaultMaxBodyBytes). File uploads are capped by engine.MaxFileBytes
	// instead.
	MaxBodyBytes int64
	// MCP, if not nil, is the MCP endpoint (pkg/mcpserver.NewHandler),
	// served at /mcp behind the same authentication as everything else.
	MCP http.Handler
	// UI, if not nil, holds the web editor's login tokens and sessions
	// (shared by the daemon's listeners); nil: no browser can log in.
	UI *UIAuth
	// Audit, if not nil, records authentication failures and changing
	// calls (audit.go).
	Audit *audit.Log
	// SSHConn, if not nil, serves one SSH connection (pkg/sshd's
	// ServeConn): GET /v1/ssh/connect relays a WebSocket to it, for
	// sandboxctl ssh-proxy where the SSH endpoint is not reachable.
	SSHConn func(net.Conn)
	// GatewaySecret (node.gateway_secret_file), when set, lets a gateway
	// that presents it name the principal it authenticated (gateway.go).
	GatewaySecret string
	// Replays, if not nil, serves POST /v1/runs/{id}/replay
	// (pkg/services/pipeline).
	Replays pipeline.Replays
	// Webhooks, if not nil, is the lifecycle webhook service, served at
	// /v1/webhooks (webhooks.go).
	Webhooks webhooks.Webhooks
}

type server struct {
	e   Engine
	opt Options
	log *slog.Logger
	mux *http.ServeMux // the routes, for GET /v1/system's features
}

// NewHandler returns the REST API over e.
func NewHandler(e Engine, opt Options) http.Handler {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &server{e: e, opt: opt, log: opt.Log}
	mux := http.NewServeMux()
	s.routeDaemon(mux)
	s.routeImages(mux)
	s.routeRuns(mux)
	s.routeSandboxes(mux)
	s.routePorts(mux)
	s.routeSSH(mux)
	s.routeJobs(mux)
	s.vmRoutes(mux)
	s.registerSnapshots(mux)
	s.routeKeys(mux)
	s.routeAudit(mux)
	s.registerVolumes(mux)
	s.registerTemplates(mux)
	s.routeWebhooks(mux)
	if opt.MCP != nil {
		mux.Handle("/mcp", s.capBody(opt.MCP))
	}
	s.routeUI(mux)
	s.mux = mux
	// Every other path, and a known path with another method, answers the
	// taxonomy's JSON rather than the mux's plain text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { s.noRoute(mux, w, r) })
	// Authentication wraps the mux, so an unauthenticated request reaches no
	// handler at all.
	// Tracing wraps them all, so that a request's span covers its
	// authentication and audit record; Caller names the principal on it.
	return s.logRequests(telemetry.HTTP(s.frontEnd(), s.traceRoute, s.auditCalls(s.authenticate(s.auditWho(telemetry.Caller(traceHandler(mux)))))))
}

// routeDaemon registers the daemon's own routes: health, metrics, status,
// the node's drain, garbage collection and the event stream.
func (s *server) routeDaemon(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.e.MetricsRegistry(), promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(s.opt.Log.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /v1/status", s.status)
	mux.HandleFunc("GET /v1/node", s.nodeStatus)
	mux.HandleFunc("PUT /v1/node/drain", s.nodeDrain)
	mux.HandleFunc("POST /v1/gc", s.gc)
	mux.HandleFunc("GET /v1/events", s.events)
	mux.HandleFunc("GET /v1/debug/pprof/{profile}", s.debugProfile)
}

// routeImages registers the image store's routes and the languages.
func (s *server) routeImages(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/images", s.images)
	mux.HandleFunc("POST /v1/images/{name}/build", s.buildImage)
	mux.HandleFunc("DELETE /v1/images/{name}", s.removeImage)
	mux.HandleFunc("POST /v1/images/prune", s.pruneImages)
	mux.HandleFunc("POST /v1/images/pull", s.pullImage)
	mux.HandleFunc("POST /v1/images/import", s.importImage)
	mux.HandleFunc("POST /v1/images/dockerfile", s.buildDockerfile)
	mux.HandleFunc("GET /v1/languages", s.languages)
}

// routeRuns registers the run pipeline's routes: runs, agent runs, their
// records and autofix.
func (s *server) routeRuns(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/run", s.runCode)
	mux.HandleFunc("POST /v1/agent/run", s.agentRun)
	mux.HandleFunc("GET /v1/runs", s.listRuns)
	mux.HandleFunc("GET /v1/runs/export", s.exportRuns)
	mux.HandleFunc("GET /v1/runs/{id}", s.getRun)
	if s.opt.Replays != nil {
		mux.HandleFunc("POST /v1/runs/{id}/replay", s.replayRun)
	}
	mux.HandleFunc("POST /v1/autofix", s.autofix)
	mux.HandleFunc("GET /v1/autofix/{id}", s.autofixStatus)
	mux.HandleFunc("POST /v1/autofix/{id}/submit", s.autofixSubmit)
}

// routeSandboxes registers a sandbox's life cycle, commands, files,
// terminal and network, and artifact downloads.
func (s *server) routeSandboxes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.terminateSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.pauseSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.resumeSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.exec)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", s.writeFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", s.readFile)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", s.deleteFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminal", s.terminal)
	mux.HandleFunc("POST /v1/sandboxes/{id}/export", s.exportFiles)
	mux.HandleFunc("GET /v1/sandboxes/{id}/network", s.sandboxNetwork)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", s.sandboxNetwork)
	mux.HandleFunc("GET /v1/artifacts/{id}", s.downloadArtifact)
	mux.HandleFunc("POST /v1/sandboxes/{id}/tasks", s.runTask)
	mux.HandleFunc("POST /v1/sandboxes/{id}/packages", s.packagesInstall)
}

// routeJobs registers a sandbox's background jobs.
func (s *server) routeJobs(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/jobs", s.startJob)
	mux.HandleFunc("GET /v1/sandboxes/{id}/jobs", s.listJobs)
	mux.HandleFunc("GET /v1/sandboxes/{id}/jobs/{job}", s.jobStatus)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/jobs/{job}", s.killJob)
}

// routeUI registers the web editor's pages and session routes (auth.go,
// ui.go) and the system description it reads.
func (s *server) routeUI(mux *http.ServeMux) {
	mux.HandleFunc("/login", s.login)
	mux.HandleFunc("GET /v1/ui/session", s.getUISession)
	mux.HandleFunc("POST /v1/ui/logout", s.logout)
	mux.HandleFunc("POST /v1/ui/login-tokens", s.mintLogin)
	mux.HandleFunc("GET /v1/system", s.system)
	mux.HandleFunc("GET /{$}", s.ui)
	mux.HandleFunc("GET /assets/", s.ui)
}

// frontEnd names the listener in traces: rest (TCP) or socket.
func (s *server) frontEnd() string {
	if s.tcp() {
		return "rest"
	}
	return "socket"
}

// traceRoute is a request's span name: the mux's route template ("POST
// /v1/sandboxes/{id}/exec"), never the raw path, so that names stay as few
// as the routes.
func (s *server) traceRoute(r *http.Request) string {
	_, pattern := s.mux.Handler(r)
	switch {
	case pattern == "" || pattern == "/":
		return r.Method + " (unmatched)"
	case !strings.Contains(pattern, " "):
		return r.Method + " " + pattern
	}
	return pattern
}

// capBody refuses a request body over MaxBodyBytes: at once when its
// Content-Length says so, else after reading that much (the handler's read
// fails), so the daemon never holds more than the cap of one request.
func (s *server) capBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.opt.MaxBodyBytes {
			s.writeError(w, r, errdefs.Invalidf("body: %d bytes is larger than server.max_request_bytes (%d bytes)", r.ContentLength, s.opt.MaxBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

// noRoute answers a request no route took: 405 with Allow when the path
// exists for other methods, else 404, both as the taxonomy's JSON.
func (s *server) noRoute(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, errorResponse{Error: errorBodyOf(
			errdefs.Invalidf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))})
		return
	}
	s.writeError(w, r, errdefs.NotFoundf("no such endpoint: %s %s", r.Method, r.URL.Path))
}

// requireUpgrade answers a WebSocket endpoint's plain HTTP request with the
// taxonomy's JSON before anything is started for it.
func (s *server) requireUpgrade(w http.ResponseWriter, r *http.Request) bool {
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return true
	}
	s.writeError(w, r, errdefs.Invalidf("%s is a WebSocket endpoint: the request needs \"Upgrade: websocket\"", r.URL.Path))
	return false
}

func (s *server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A region of Go's execution tracer (free when no trace runs) per
		// request, and one for its handler below authentication and the
		// audit record (traceHandler): the front end's own share of a call
		// is the difference (docs/ARCHITECTURE.md, "Where run_code's and
		// the front ends' time goes").
		defer rtrace.StartRegion(r.Context(), "api.request").End()
		start := time.Now()
		rec := &telemetry.StatusWriter{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		s.log.Debug("api request", "method", r.Method, "path", r.URL.Path, "status", rec.Status(),
			"duration", time.Since(start))
	})
}

// traceHandler is next in an execution-tracer region, api.handler: the
// route's own work (decode, the engine's call, encode).
func traceHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer rtrace.StartRegion(r.Context(), "api.handler").End()
		next.ServeHTTP(w, r)
	})
}

// errorBody and errorResponse are the contract's error object
// (pkg/apitypes), named short for the handlers.
type (
	errorBody     = apitypes.ErrorBody
	errorResponse = apitypes.ErrorResponse
)

func errorBodyOf(err error) errorBody { return apitypes.ErrorBodyOf(err) }

// writeError is the one place where errors become HTTP responses, with the
// status of pkg/errdefs/errhttp's one table. Internal errors are logged with
// their cause, which the client never sees.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status := errhttp.ToHTTP(err)
	telemetry.RecordError(r.Context(), err)
	if status >= http.StatusInternalServerError {
		s.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, status, errorResponse{Error: errorBodyOf(err)})
}

// reply is the end of most handlers: the engine's error in the taxonomy's
// JSON, or v with status. v must be safe to build when err is set (the
// engine's result, or a literal around it that does not dereference it).
func (s *server) reply(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, v)
}

// decodeStreamable reads a request that may ask for a streamed answer
// (?stream=true) and its JSON body into v.
func (s *server) decodeStreamable(w http.ResponseWriter, r *http.Request, v any) (stream bool, err error) {
	if stream, err = queryBool(r, "stream"); err != nil {
		return false, err
	}
	return stream, s.decodeJSON(w, r, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status is sent; a failed write means the client went away.
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads one JSON object from the body into v, refusing unknown
// fields, trailing data and bodies over the size cap, with messages that
// name the problem.
func (s *server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err == nil {
			return errdefs.Invalidf("body: unexpected data after the JSON object")
		}
		return bodyError(err)
	}
	return nil
}

func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "body: larger than %d bytes", tooLarge.Limit)
	}
	return apitypes.DecodeError("body", err)
}

// queryBool parses an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	b, err := queryOptBool(r, name)
	return b != nil && *b, err
}

// queryOptBool parses an optional boolean query parameter; nil when absent.
func queryOptBool(r *http.Request, name string) (*bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return nil, errdefs.Invalidf("%s: want true or false, got %q", name, v)
	}
	return &b, nil
}

// queryInt parses an optional integer query parameter of the given bit size.
func queryInt(r *http.Request, name string, bits int) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, bits)
	if err != nil {
		return 0, errdefs.Invalidf("%s: want an integer, got %q", name, v)
	}
	return n, nil
}

// queryUint16 parses an optional unsigned 16-bit query parameter.
func queryUint16(r *http.Request, name string) (uint16, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return 0, errdefs.Invalidf("%s: want an integer from 0 to 65535, got %q", name, v)
	}
	return uint16(n), nil
}

// queryEnv parses repeated env=K=V query parameters.
func queryEnv(r *http.Request) (map[string]string, error) {
	vals := r.URL.Query()["env"]
	if len(vals) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, errdefs.Invalidf("env: want NAME=VALUE, got %q", kv)
		}
		env[k] = v
	}
	return env, nil
}
