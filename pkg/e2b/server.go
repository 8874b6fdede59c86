package e2b

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// EnvdPort is the port of envd in an E2B sandbox: requests routed to it are
// served by this package; any other port is relayed into the sandbox.
const EnvdPort = 49983

// EnvdVersion is the envd version this package implements, as the SDKs
// read it: they switch behaviour on it (stdin close needs 0.5.2,
// octet-stream uploads 0.5.7; 0.6.2's file metadata is not built, so it is
// not claimed).
const EnvdVersion = "0.5.7"

// clientID is the constant E2B itself returns for the retired client id
// (the Python SDK requires the field).
const clientID = "6532622b"

// Labels the front end keeps on its sandboxes.
const (
	labelTemplate = "e2b.template"
	labelToken    = "e2b.access_token"
	metaPrefix    = "e2b.meta."
)

// Options configure a Server.
type Options struct {
	// Auth authenticates the control plane's X-API-Key (pkg/tenants: the
	// daemon's API keys, e2b.api_key_file's among them) and names the
	// caller whose tenant owns what it creates and bounds what it sees.
	Auth Authenticator
	// Keys, when Auth is nil, are the accepted API keys, all admins (tests).
	Keys []string
	// Domain is the host-name routing domain ({port}-{id}.{domain}),
	// returned to clients as the sandboxes' domain; empty: none.
	Domain string
	// GatewaySecret (node.gateway_secret_file), when set, lets a gateway
	// forward control-plane calls with the principal it authenticated
	// (gateway.go).
	GatewaySecret string
	Log           *slog.Logger
}

// Server is the E2B front end: one http.Handler for control plane, data
// plane and user ports.
type Server struct {
	b     Backend
	opt   Options
	log   *slog.Logger
	api   http.Handler
	envd  http.Handler
	procs *processes
	watch *watchers
	mu    sync.Mutex
	cpu   map[string]cpuSample
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	// pidSeq numbers processes whose pid the agent did not report.
	pidSeq atomic.Uint32
	// adoptMu serializes taking over commands after a restart (findProc).
	adoptMu sync.Mutex
}

// New returns a Server over b.
func New(b Backend, opt Options) *Server {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.Auth == nil {
		opt.Auth = keyList(opt.Keys)
	}
	s := &Server{b: b, opt: opt, log: opt.Log, procs: newProcesses(), watch: newWatchers(), cpu: map[string]cpuSample{}}
	s.api = s.controlPlane()
	s.envd = s.dataPlane()
	s.proxy, s.tr = s.newProxy()
	return s
}

// Close ends the watchers and detaches from processes (they keep running).
func (s *Server) Close() {
	s.watch.closeAll()
	s.procs.closeAll()
	s.tr.CloseIdleConnections()
}

// ReadKeys reads an API key file: one key per line, e2b_ and hex digits,
// blank lines and # comments ignored.
func ReadKeys(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !keyRe.MatchString(line) {
			return nil, fmt.Errorf("%s:%d: an E2B API key is e2b_ followed by hex digits (the SDKs refuse other forms)", path, n)
		}
		keys = append(keys, line)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no API key", path)
	}
	return keys, nil
}

var keyRe = regexp.MustCompile(`^e2b_[0-9a-f]{16,}$`)

// ServeHTTP routes a request: to a sandbox (routing headers, or a host
// name under the domain), else to the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, routed := s.route(r)
	if !routed {
		s.api.ServeHTTP(w, r)
		return
	}
	if port == EnvdPort {
		r = r.WithContext(context.WithValue(r.Context(), sandboxKey{}, id))
		s.envd.ServeHTTP(w, r)
		return
	}
	s.relay(w, r, id, port)
}

type sandboxKey struct{}

// route finds the sandbox and port a request is for. Headers win (they are
// what E2B_SANDBOX_URL clients send); a host name {port}-{id}.{domain}
// comes next; a /files request without either is routed by its signature
// (signed URLs are fetched without headers).
func (s *Server) route(r *http.Request) (id string, port int, ok bool) {
	if h := r.Header.Get("E2b-Sandbox-Id"); h != "" {
		port := EnvdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				n = -1
			}
			port = n
		}
		return h, port, true
	}
	if d := s.opt.Domain; d != "" {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(d)); ok && !strings.Contains(label, ".") {
			p, sid, ok := strings.Cut(label, "-")
			if n, err := strconv.Atoi(p); ok && err == nil && n > 0 && n <= 65535 {
				return sid, n, true
			}
			return label, -1, true
		}
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		if id := s.signedSandbox(r); id != "" {
			return id, EnvdPort, true
		}
	}
	return "", 0, false
}

// errorBody is E2B's error object: the JS SDK branches on code, Python on
// the status; both are the HTTP status.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, errorBody{Code: status, Message: fmt.Sprintf(format, args...)})
}

func writeErr(w http.ResponseWriter, err error) {
	// The daemon's one taxonomy → status table (pkg/errdefs/errhttp), shared
	// with REST and the Go client, so the two front ends cannot drift.
	st := errhttp.ToHTTP(err)
	writeJSON(w, st, errorBody{Code: st, Message: errdefs.MessageOf(err)})
}

// Authenticator turns an API key into a principal: the daemon's one
// authenticator (pkg/tenants), shared with every front end.
type Authenticator interface {
	Authenticate(secret, source string) (principal.Principal, error)
}

// keyList is the Authenticator of Options.Keys.
type keyList []string

// Authenticate compares in constant time against every key.
func (l keyList) Authenticate(k, _ string) (principal.Principal, error) {
	ok := false
	for _, want := range l {
		if subtle.ConstantTimeCompare([]byte(k), []byte(want)) == 1 {
			ok = true
		}
	}
	if !ok {
		return principal.Principal{}, errdefs.Unauthenticatedf("invalid API key")
	}
	return principal.Principal{KeyID: "key-e2b", KeyName: "e2b", Tenant: "admin", Admin: true}, nil
}

// ToE2B is the E2B form of a sandbox id: lowercase letters and digits.
func ToE2B(id string) string { return strings.ReplaceAll(id, "-", "") }

var e2bIDRe = regexp.MustCompile(`^sb[0-9a-f]{1,62}$`)

// FromE2B is our id of an E2B sandbox id; ok is false for a malformed one.
// A legacy "{id}-{clientID}" (SDKs before 1.8) is accepted.
func FromE2B(e string) (string, bool) {
	e = strings.TrimSuffix(e, "-"+clientID)
	if !e2bIDRe.MatchString(e) {
		return "", false
	}
	return "sb-" + e[2:], true
}
