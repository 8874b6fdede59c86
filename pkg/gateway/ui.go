package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The web editor through the gateway. A daemon keeps its editor's login
// tokens and sessions in memory; a fleet's gateways are several stateless
// replicas behind one Service, and a browser's next request may reach any
// of them. So the gateway's tokens and sessions are signed, not stored:
// each is a payload (the principal of the key that minted the login, an
// expiry, a nonce, the session's CSRF token) and an HMAC-SHA256 under a key
// derived from the gateway secret, which every gateway holds and no caller
// does. Security boundary:
//
//   - a session acts as the key its login was minted with and ends when
//     that key is revoked or expires (Auth.Valid on every request), or at
//     its own expiry (api.DefaultSessionTTL);
//   - a login token is single-use across the fleet when the gateways share
//     the fleet's database (FleetStore.UseLogin), else within one gateway;
//     it expires after api.DefaultLoginTTL;
//   - cookie-authenticated requests pass api.BrowserChecks (CSRF header,
//     cross-origin refusal, WebSocket origin), as on a node;
//   - logging out clears the browser's cookie; a copy of the cookie made
//     before stays valid until its expiry or its key's revocation (nothing
//     is stored to revoke it by).
//
// The page itself is the daemon's bundle (api.ServeWebUI); its API calls are
// the gateway's REST routes, placed, routed and merged as any.

// uiKey is the signing key of the gateway's editor tokens.
func (g *Gateway) uiKey() []byte {
	m := hmac.New(sha256.New, []byte(g.opt.Secret))
	m.Write([]byte("mcp-sandboxd gateway web editor v1"))
	return m.Sum(nil)
}

// uiClaims is a login token's or a session's payload.
type uiClaims struct {
	P       principal.Principal `json:"p"`
	Expires int64               `json:"exp"` // unix seconds
	Nonce   string              `json:"n"`
	CSRF    string              `json:"csrf,omitempty"` // sessions only
}

func (g *Gateway) sign(kind string, c uiClaims) string {
	payload, _ := json.Marshal(c) // strings, a bool and an int
	enc := base64.RawURLEncoding.EncodeToString(payload)
	m := hmac.New(sha256.New, g.uiKey())
	m.Write([]byte(kind + "." + enc))
	return enc + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verify returns the claims of a token of kind signed by a gateway of this
// fleet and not expired.
func (g *Gateway) verify(kind, tok string) (uiClaims, bool) {
	var c uiClaims
	enc, mac, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > 8192 {
		return c, false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil {
		return c, false
	}
	m := hmac.New(sha256.New, g.uiKey())
	m.Write([]byte(kind + "." + enc))
	if subtle.ConstantTimeCompare(got, m.Sum(nil)) != 1 {
		return c, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || json.Unmarshal(payload, &c) != nil || c.Nonce == "" {
		return c, false
	}
	return c, time.Now().Unix() < c.Expires
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// usedLogins are the login nonces this gateway redeemed, when there is no
// fleet database to record them in.
type usedLogins struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// use records nonce; false if it was used already.
func (u *usedLogins) use(n string, exp time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	for k, e := range u.m {
		if now.After(e) {
			delete(u.m, k)
		}
	}
	if _, ok := u.m[n]; ok {
		return false
	}
	if u.m == nil {
		u.m = map[string]time.Time{}
	}
	u.m[n] = exp
	return true
}

// mintLogin is POST /v1/ui/login-tokens on a gateway (`sandboxctl --url
// GATEWAY ui`): a login URL on the address the caller reached this gateway
// at, whose session acts as the caller's key. A browser session may not
// mint (it would outlive itself).
func (g *Gateway) mintLogin(w http.ResponseWriter, r *http.Request, p principal.Principal, browser bool) {
	if browser {
		writeError(w, errdefs.PermissionDeniedf("login tokens are minted with a bearer key, not by a browser session"))
		return
	}
	exp := time.Now().Add(api.DefaultLoginTTL)
	tok := g.sign("login", uiClaims{P: p, Expires: exp.Unix(), Nonce: nonce()})
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	writeJSON(w, http.StatusCreated, api.LoginURL{URL: scheme + "://" + r.Host + "/login?token=" + url.QueryEscape(tok), Token: tok, ExpiresAt: exp.UTC()})
}

// login redeems a login token (GET /login?token= or a form post): a
// session cookie and a redirect to the editor.
func (g *Gateway) login(w http.ResponseWriter, r *http.Request) {
	tok, ok := api.LoginToken(w, r)
	if !ok {
		return
	}
	if tok == "" {
		api.LoginPage(w, http.StatusUnauthorized, "")
		return
	}
	c, ok := g.verify("login", tok)
	if ok {
		// The audit record of the login names the key it acts as.
		audit.CallFrom(r.Context()).SetPrincipal(c.P)
		exp := time.Unix(c.Expires, 0)
		if g.opt.Fleet != nil {
			used, err := g.opt.Fleet.UseLogin(r.Context(), c.Nonce, exp)
			if err != nil {
				api.LoginPage(w, http.StatusServiceUnavailable, "The fleet's database does not answer; try again.")
				return
			}
			ok = used
		} else {
			ok = g.logins.use(c.Nonce, exp)
		}
	}
	if !ok || !g.opt.Auth.Valid(c.P.KeyID) {
		api.LoginPage(w, http.StatusUnauthorized, "That login link is invalid, used or expired. Run `sandboxctl ui` for a new one.")
		return
	}
	sexp := time.Now().Add(api.DefaultSessionTTL)
	sess := g.sign("session", uiClaims{P: c.P, Expires: sexp.Unix(), Nonce: nonce(), CSRF: nonce()})
	http.SetCookie(w, &http.Cookie{Name: api.SessionCookie, Value: sess, Path: "/", Expires: sexp,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// session returns the claims of r's session cookie, if it is a valid
// session of a key that still authenticates.
func (g *Gateway) session(r *http.Request) (uiClaims, bool) {
	ck, err := r.Cookie(api.SessionCookie)
	if err != nil || ck.Value == "" {
		return uiClaims{}, false
	}
	c, ok := g.verify("session", ck.Value)
	return c, ok && g.opt.Auth.Valid(c.P.KeyID)
}

// uiSession is GET /v1/ui/session: the page's CSRF token.
func (g *Gateway) uiSession(w http.ResponseWriter, c uiClaims, browser bool) {
	if !browser {
		writeError(w, errdefs.Invalidf("session: this request has no browser session (it used a bearer key)"))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, struct {
		CSRFToken string    `json:"csrf_token"`
		ExpiresAt time.Time `json:"expires_at"`
	}{c.CSRF, time.Unix(c.Expires, 0).UTC()})
}

// logout is POST /v1/ui/logout: the browser's cookie is cleared.
func (g *Gateway) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: api.SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	writeJSON(w, http.StatusOK, struct {
		LoggedOut bool `json:"logged_out"`
	}{true})
}

// isAPIPath says whether an unauthenticated request to path is answered
// with JSON (else with the login page), as on a node.
func isAPIPath(path string) bool {
	return strings.HasPrefix(path, "/v1/") || path == "/v1" || path == "/mcp" || strings.HasPrefix(path, "/mcp/") ||
		path == "/metrics" || path == "/readyz"
}
