package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	rtrace "runtime/trace"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Authentication of the TCP listener: the one place that decides who may
// reach which route. Two kinds of callers are admitted:
//
//   - API clients (sandboxctl --url, MCP clients, scripts) with the bearer
//     token in an Authorization header, on every route;
//   - browsers of the web editor with a session cookie, obtained by
//     redeeming a one-time login token at /login (like Jupyter's token URL).
//
// Everything else is refused: /v1, /mcp, /metrics and /readyz answer 401
// JSON, every other path the small login page with status 401, so that none
// of the editor's code reaches an unauthenticated browser. /healthz (no
// secrets, for liveness probes) and /login are the only open routes.
//
// Security boundary for cookie-authenticated requests, which a browser may
// send on behalf of any page it shows:
//
//   - the cookie is HttpOnly (page scripts cannot read it) and
//     SameSite=Strict (other sites' requests do not carry it; but a page of
//     the same site on another port, e.g. 127.0.0.1:8000, does get it sent,
//     hence the checks below);
//   - a state-changing request (any method but GET, HEAD, OPTIONS) must pass
//     http.CrossOriginProtection (Sec-Fetch-Site, else Origin against Host)
//     and carry the session's CSRF token in the X-CSRF-Token header, which
//     only a same-origin page can read (from GET /v1/ui/session);
//   - a WebSocket upgrade must carry an Origin whose host is the request's
//     Host: WebSockets are not subject to CORS, so a foreign page could
//     otherwise open one with the user's cookie.
//
// Login tokens are single-use and short-lived; sessions expire; both are
// kept in memory only (a daemon restart logs every browser out) and stored
// as SHA-256 hashes, so the maps hold nothing a memory dump could replay
// directly. The unix socket has no authentication at all (its file mode is
// the access control) and mints login tokens for `sandboxctl ui`.

// Names and defaults of the browser session.
const (
	// SessionCookie is the name of the web editor's session cookie.
	SessionCookie = "sandboxd_session"
	// CSRFHeader carries the session's CSRF token on state-changing requests.
	CSRFHeader = "X-CSRF-Token"
	// DefaultLoginTTL is how long an unused login token stays valid.
	DefaultLoginTTL = 10 * time.Minute
	// DefaultSessionTTL is how long a browser session lasts after login.
	DefaultSessionTTL = 12 * time.Hour
	// maxUIEntries bounds the login tokens and the sessions each, so that a
	// client minting tokens in a loop cannot grow the daemon's memory.
	maxUIEntries = 1024
)

// UIAuthOptions configure NewUIAuth.
type UIAuthOptions struct {
	// BaseURL is the editor's address as a browser reaches it (the HTTP
	// listener, e.g. http://127.0.0.1:7070); login URLs are built on it.
	// Empty: the daemon has no HTTP listener and mints no login tokens.
	BaseURL    string
	LoginTTL   time.Duration // default DefaultLoginTTL
	SessionTTL time.Duration // default DefaultSessionTTL
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// UIAuth holds the web editor's one-time login tokens and browser sessions.
// One value is shared by the daemon's listeners (Options.UI): `sandboxctl ui`
// mints a token on the unix socket, the browser redeems it over TCP.
type UIAuth struct {
	opt UIAuthOptions

	mu       sync.Mutex
	logins   map[[32]byte]login     // token hash → expiry and principal
	sessions map[[32]byte]uiSession // session id hash → session
}

type login struct {
	expires time.Time
	p       principal.Principal
}

type uiSession struct {
	expires time.Time
	csrf    string
	// p is the principal of the key the login was minted with: the
	// session acts as that key, and ends when the key is revoked.
	p principal.Principal
}

// NewUIAuth returns an empty token and session store.
func NewUIAuth(opt UIAuthOptions) *UIAuth {
	if opt.LoginTTL <= 0 {
		opt.LoginTTL = DefaultLoginTTL
	}
	if opt.SessionTTL <= 0 {
		opt.SessionTTL = DefaultSessionTTL
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	opt.BaseURL = strings.TrimSuffix(opt.BaseURL, "/")
	return &UIAuth{opt: opt, logins: map[[32]byte]login{}, sessions: map[[32]byte]uiSession{}}
}

// LoginURL is a minted login token and the URL that redeems it.
type LoginURL = apitypes.LoginURL

// MintLogin creates a one-time login token whose session acts as p.
func (a *UIAuth) MintLogin(p principal.Principal) (*LoginURL, error) {
	if a.opt.BaseURL == "" {
		return nil, errdefs.Unavailablef("web editor: the daemon has no HTTP listener (server.http_addr is empty)")
	}
	tok := randomHex()
	now := a.opt.Now()
	exp := now.Add(a.opt.LoginTTL)
	a.mu.Lock()
	defer a.mu.Unlock()
	prune(a.logins, now, func(l login) time.Time { return l.expires })
	if len(a.logins) >= maxUIEntries {
		return nil, errdefs.LimitExceededf("web editor: %d unused login tokens outstanding; wait for them to expire", len(a.logins))
	}
	a.logins[sha256.Sum256([]byte(tok))] = login{exp, p}
	return &LoginURL{URL: a.opt.BaseURL + "/login?token=" + url.QueryEscape(tok), Token: tok, ExpiresAt: exp}, nil
}

// redeem consumes a login token and opens a session; ok is false when the
// token is unknown, used or expired.
func (a *UIAuth) redeem(tok string) (id string, s uiSession, ok bool) {
	h := sha256.Sum256([]byte(tok))
	now := a.opt.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	l, found := a.logins[h]
	delete(a.logins, h) // single use, also when expired
	if !found || !now.Before(l.expires) {
		return "", uiSession{}, false
	}
	prune(a.sessions, now, func(s uiSession) time.Time { return s.expires })
	if len(a.sessions) >= maxUIEntries {
		return "", uiSession{}, false
	}
	id = randomHex()
	s = uiSession{expires: now.Add(a.opt.SessionTTL), csrf: randomHex(), p: l.p}
	a.sessions[sha256.Sum256([]byte(id))] = s
	return id, s, true
}

// session looks a session cookie's value up.
func (a *UIAuth) session(id string) (uiSession, bool) {
	h := sha256.Sum256([]byte(id))
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[h]
	if ok && !a.opt.Now().Before(s.expires) {
		delete(a.sessions, h)
		return uiSession{}, false
	}
	return s, ok
}

// logout ends a session.
func (a *UIAuth) logout(id string) {
	a.mu.Lock()
	delete(a.sessions, sha256.Sum256([]byte(id)))
	a.mu.Unlock()
}

func prune[V any](m map[[32]byte]V, now time.Time, expiry func(V) time.Time) {
	for k, v := range m {
		if !now.Before(expiry(v)) {
			delete(m, k)
		}
	}
}

func randomHex() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// caller says how a request was authenticated.
type caller int

const (
	callerSocket  caller = iota // the unix socket: no token configured
	callerBearer                // Authorization: Bearer
	callerBrowser               // session cookie
	callerGateway               // forwarded by a gateway (gateway.go)
)

type callerKey struct{}

type callerInfo struct {
	kind    caller
	session uiSession
}

func callerOf(r *http.Request) callerInfo {
	c, _ := r.Context().Value(callerKey{}).(callerInfo)
	return c
}

func withCaller(r *http.Request, c callerInfo) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), callerKey{}, c))
}

// isAPIPath says whether an unauthenticated request to path gets a JSON 401
// (API routes) rather than the login page.
func isAPIPath(path string) bool {
	return strings.HasPrefix(path, "/v1/") || path == "/v1" || path == "/mcp" || strings.HasPrefix(path, "/mcp/") ||
		path == "/metrics" || path == "/readyz"
}

// Authenticator turns a presented key into a principal (pkg/tenants'
// Service): the one authenticator of every front end.
type Authenticator interface {
	// Authenticate returns the principal of secret presented from source
	// (host:port): `unauthenticated` for a key that is not one,
	// `limit_exceeded` for a source over its failure rate.
	Authenticate(secret, source string) (principal.Principal, error)
	// Valid says whether key id still authenticates (web sessions minted
	// for a key end when it is revoked or expires).
	Valid(keyID string) bool
}

// tokenAuth is the Authenticator of Options.Token: one admin token.
type tokenAuth []byte

func (t tokenAuth) Authenticate(secret, _ string) (principal.Principal, error) {
	// ConstantTimeCompare leaks only the token's length, not its content.
	if subtle.ConstantTimeCompare([]byte(secret), t) == 1 {
		return principal.Principal{KeyID: "key-token", KeyName: "token", Tenant: "admin", Admin: true}, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("missing or invalid API key")
}

func (t tokenAuth) Valid(string) bool { return true }

// frontEnd names the door a request of path came through, for its Origin.
func frontEnd(path string, c caller) string {
	switch {
	case c == callerSocket:
		return "socket"
	case c == callerBrowser:
		return "web"
	case c == callerGateway:
		return "gateway"
	case path == "/mcp" || strings.HasPrefix(path, "/mcp/"):
		return "mcp"
	}
	return "rest"
}

// admit hands r on with its principal and origin in its context.
func admit(next http.Handler, w http.ResponseWriter, r *http.Request, c callerInfo, p principal.Principal) {
	src := r.RemoteAddr
	if c.kind == callerSocket {
		src = "unix"
	}
	ctx := principal.WithOrigin(principal.With(r.Context(), p), principal.Origin{FrontEnd: frontEnd(r.URL.Path, c.kind), Source: src})
	next.ServeHTTP(w, withCaller(r.WithContext(ctx), c))
}

// authenticate admits bearer-key and session-cookie callers as described
// at the top of this file, with their principal in the request's context.
// With no authenticator (the unix socket) every request passes as the
// administrator (principal.Socket).
func (s *server) authenticate(next http.Handler) http.Handler {
	auth := s.opt.Auth
	if auth == nil && s.opt.Token != "" {
		auth = tokenAuth(s.opt.Token)
	}
	if auth == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			admit(next, w, r, callerInfo{kind: callerSocket}, principal.Socket)
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/login" {
			next.ServeHTTP(w, r)
			return
		}
		if p, ok, err := s.gatewayPrincipal(r); ok || err != nil {
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			if !p.Admin && adminOnly(r) {
				s.writeError(w, r, errdefs.PermissionDeniedf("%s %s: needs an admin key (key %s is of scope user)", r.Method, r.URL.Path, p.KeyName))
				return
			}
			admit(next, w, r, callerInfo{kind: callerGateway}, p)
			return
		}
		scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if strings.EqualFold(scheme, "Bearer") && tok != "" {
			reg := rtrace.StartRegion(r.Context(), "api.authenticate")
			p, err := auth.Authenticate(tok, r.RemoteAddr)
			reg.End()
			if err == nil {
				if !p.Admin && adminOnly(r) {
					s.writeError(w, r, errdefs.PermissionDeniedf("%s %s: needs an admin key (key %s is of scope user)", r.Method, r.URL.Path, p.KeyName))
					return
				}
				admit(next, w, r, callerInfo{kind: callerBearer}, p)
				return
			}
			if errdefs.Is(err, errdefs.LimitExceeded) {
				s.writeError(w, r, err)
				return
			}
		}
		if sess, ok := s.browserSession(r); ok && auth.Valid(sess.p.KeyID) {
			if err := browserChecks(r, sess); err != nil {
				s.writeError(w, r, err)
				return
			}
			if !sess.p.Admin && adminOnly(r) {
				s.writeError(w, r, errdefs.PermissionDeniedf("%s %s: needs an admin key", r.Method, r.URL.Path))
				return
			}
			admit(next, w, r, callerInfo{kind: callerBrowser, session: sess}, sess.p)
			return
		}
		if isAPIPath(r.URL.Path) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-sandboxd"`)
			s.writeError(w, r, errdefs.Unauthenticatedf("missing or invalid bearer token or session cookie"))
			return
		}
		s.loginPage(w, http.StatusUnauthorized, "")
	})
}

// browserSession returns the session of the request's cookie, if valid.
func (s *server) browserSession(r *http.Request) (uiSession, bool) {
	if s.opt.UI == nil {
		return uiSession{}, false
	}
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return uiSession{}, false
	}
	return s.opt.UI.session(c.Value)
}

// crossOrigin refuses state-changing requests that browsers mark as
// cross-origin (Sec-Fetch-Site) or whose Origin is not the Host.
var crossOrigin = http.NewCrossOriginProtection()

// browserChecks are the CSRF and cross-origin defences of cookie-authenticated
// requests (see the top of this file).
func browserChecks(r *http.Request, sess uiSession) error { return BrowserChecks(r, sess.csrf) }

// BrowserChecks are the defences of a cookie-authenticated request whose
// session's CSRF token is csrf (the gateway's sessions too): a WebSocket
// from the page's own origin only, no cross-origin state change, and the
// CSRF header on every request that is not GET, HEAD or OPTIONS.
func BrowserChecks(r *http.Request, csrf string) error {
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		origin := r.Header.Get("Origin")
		u, err := url.Parse(origin)
		if origin == "" || err != nil || !strings.EqualFold(u.Host, r.Host) {
			return errdefs.PermissionDeniedf("WebSocket from a foreign or missing Origin %s", quoteOrEmpty(origin))
		}
	}
	if err := crossOrigin.Check(r); err != nil {
		return errdefs.PermissionDeniedf("cross-origin request refused: %v", err)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if got := r.Header.Get(CSRFHeader); csrf == "" || subtle.ConstantTimeCompare([]byte(got), []byte(csrf)) != 1 {
		return errdefs.PermissionDeniedf("missing or invalid %s header (get it from GET /v1/ui/session)", CSRFHeader)
	}
	return nil
}

func quoteOrEmpty(s string) string {
	if s == "" {
		return "(none)"
	}
	return "\"" + s + "\""
}

// LoginToken reads a login request's one-time token: GET /login?token=,
// or POST /login with a form field token, refused from other sites (login
// CSRF); HEAD has none and never consumes one. Not ok: the refusal has
// been answered. The daemon and a gateway both redeem logins this way.
func LoginToken(w http.ResponseWriter, r *http.Request) (tok string, ok bool) {
	switch r.Method {
	case http.MethodGet:
		tok = r.URL.Query().Get("token")
	case http.MethodHead:
	case http.MethodPost:
		if err := crossOrigin.Check(r); err != nil {
			LoginPage(w, http.StatusForbidden, "Cross-site login refused.")
			return "", false
		}
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		tok = r.PostFormValue("token")
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		writeJSON(w, http.StatusMethodNotAllowed, errorResponse{Error: errorBodyOf(errdefs.Invalidf("method: want GET or POST"))})
		return "", false
	}
	return tok, true
}

// login redeems a one-time token: GET /login?token= (the URL `sandboxctl ui`
// prints) or POST /login with a form field token. Success sets the session
// cookie and redirects to the editor, dropping the token from the address
// bar; anything else shows the login page (HEAD never consumes a token).
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	tok, ok := LoginToken(w, r)
	if !ok {
		return
	}
	if tok == "" {
		if _, ok := s.browserSession(r); ok {
			http.Redirect(w, r, "/", http.StatusSeeOther) // logged in already
			return
		}
		s.loginPage(w, http.StatusUnauthorized, "")
		return
	}
	if s.opt.UI == nil {
		s.loginPage(w, http.StatusServiceUnavailable, "This listener serves no web editor.")
		return
	}
	id, sess, ok := s.opt.UI.redeem(tok)
	if !ok {
		s.loginPage(w, http.StatusUnauthorized, "That login link is invalid, used or expired. Run `sandboxctl ui` for a new one.")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: id, Path: "/", Expires: sess.expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// uiSessionInfo is GET /v1/ui/session: what the page needs of its session.
type uiSessionInfo struct {
	CSRFToken string    `json:"csrf_token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *server) getUISession(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	if c.kind != callerBrowser {
		s.writeError(w, r, errdefs.Invalidf("session: this request has no browser session (it used the bearer token or the socket)"))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, uiSessionInfo{CSRFToken: c.session.csrf, ExpiresAt: c.session.expires})
}

// logout ends the browser session: POST /v1/ui/logout.
func (s *server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(SessionCookie); err == nil && s.opt.UI != nil {
		s.opt.UI.logout(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	writeJSON(w, http.StatusOK, struct {
		LoggedOut bool `json:"logged_out"`
	}{true})
}

// mintLogin is POST /v1/ui/login-tokens (`sandboxctl ui`): a one-time login
// URL. A browser session may not mint: a session must not extend itself
// past its expiry.
func (s *server) mintLogin(w http.ResponseWriter, r *http.Request) {
	if callerOf(r).kind == callerBrowser {
		s.writeError(w, r, errdefs.PermissionDeniedf("login tokens are minted with the bearer token or on the unix socket, not by a browser session"))
		return
	}
	if s.opt.UI == nil {
		s.writeError(w, r, errdefs.Unavailablef("web editor: not enabled on this daemon"))
		return
	}
	p, ok := principal.From(r.Context())
	if !ok {
		p = principal.Socket
	}
	l, err := s.opt.UI.MintLogin(p)
	s.reply(w, r, http.StatusCreated, l, err)
}

// keyRevoked says whether the key ctx's request authenticated with no
// longer authenticates (revoked or expired since): long-lived connections
// (terminal WebSockets) ask it on each message.
func (s *server) keyRevoked(ctx context.Context) bool {
	p, ok := principal.From(ctx)
	if c, _ := ctx.Value(callerKey{}).(callerInfo); c.kind == callerGateway {
		// The key lives in the fleet's store, which the gateway checked
		// when the request came in; this node's store does not hold it.
		return false
	}
	return ok && s.opt.Auth != nil && !s.opt.Auth.Valid(p.KeyID)
}

// adminOnly says whether r is for a route only admin keys may use: what
// spans every tenant (metrics, the runs export, garbage collection, the
// image store, the keys). The engine checks the keys again.
func adminOnly(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == "/metrics", p == "/v1/gc", p == "/v1/node", p == "/v1/node/drain", p == "/v1/runs/export", p == "/v1/keys", strings.HasPrefix(p, "/v1/keys/") && !strings.HasSuffix(p, "/usage"):
		return true
	case strings.HasPrefix(p, "/v1/debug/"):
		return true
	case strings.HasPrefix(p, "/v1/images") && r.Method != http.MethodGet:
		return true
	}
	return false
}
