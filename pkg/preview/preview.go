// Package preview is the daemon's preview listener: it serves HTTP and
// WebSocket traffic to the ports of sandboxes that were exposed
// (engine.ExposePort) at /preview/{sandbox_id}/{port}/... and, for a
// listener on the loopback, at http://p{port}-{sandbox_id}.localhost:PORT/
// (an origin per exposure), relaying each connection through the sandbox's
// agent, so that it works in every network mode (none included) and with
// every backend.
//
// It is a front end like pkg/api: the engine decides which ports are
// exposed and checks tokens; this package parses requests, turns a token
// in a URL into a cookie and proxies.
//
// Security boundary (what a request must carry, and what is kept from the
// sandbox):
//
//   - a token of the exposure: the PreviewTokenHeader header (programs),
//     the PreviewTokenParam query parameter (a URL a browser opens; it is
//     exchanged for a cookie and the browser redirected to the URL without
//     it) or that cookie. The cookie is HttpOnly (the previewed page's
//     scripts cannot read it), SameSite=Lax and scoped to the exposure's
//     path. The listener is its own origin, apart from the API's listener,
//     so a previewed page cannot script the API or the web editor; the
//     exposures of one daemon share that origin (a page of one exposure
//     could fetch another's path with the browser's cookies), which is
//     why tokens are per exposure, the listener is on loopback by default
//     and the host-name form (an origin per exposure, host-only cookie)
//     is offered beside the path form;
//   - a WebSocket upgrade authenticated by the cookie must carry an Origin
//     of the listener itself: WebSockets escape CORS, so a foreign page
//     could otherwise open one with the cookie;
//   - the token never reaches the sandbox: the header, the query
//     parameter and the cookie are removed before the request is relayed.
package preview

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// CookieName is the preview session cookie; its path scopes it to one
// exposure.
const CookieName = "sandboxd_preview"

// Engine is what the preview listener needs of pkg/engine.
type Engine interface {
	AuthorizePreview(id string, port int, token string) error
	DialExposed(ctx context.Context, id string, port int) (net.Conn, error)
}

var _ Engine = (*engine.Engine)(nil)

// Handler serves the preview listener.
type Handler struct {
	eng   Engine
	log   *slog.Logger
	proxy *httputil.ReverseProxy
	tr    *http.Transport
}

// NewHandler returns the preview listener's handler.
func NewHandler(eng Engine, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{eng: eng, log: log}
	// The transport's address is "{sandbox_id}:{port}" (see ServeHTTP), so
	// that pooled connections are never shared between exposures.
	h.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, port, err := splitTarget(addr)
			if err != nil {
				return nil, err
			}
			return eng.DialExposed(ctx, id, port)
		},
		MaxIdleConnsPerHost: 8,
		// Each relayed connection holds an agent connection and two
		// goroutines in the sandbox's agent: bound them per exposure.
		MaxConnsPerHost:       64,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	h.proxy = &httputil.ReverseProxy{
		// ServeHTTP has built the outbound URL; the X-Forwarded headers
		// are set here because ReverseProxy removes them before Rewrite.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			if p := pr.In.Header.Get("X-Forwarded-Prefix"); p != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", p)
			}
		},
		Transport: h.tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !errdefs.Is(err, errdefs.Unavailable) && !errdefs.Is(err, errdefs.NotFound) {
				h.log.Warn("preview relay failed", "path", r.URL.Path, "err", err)
			}
			writeError(w, http.StatusBadGateway, errdefs.CodeOf(err), "preview: "+errdefs.MessageOf(err))
		},
	}
	return h
}

// Close drops idle relayed connections.
func (h *Handler) Close() { h.tr.CloseIdleConnections() }

func splitTarget(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, err
	}
	return host, port, nil
}

// parsePath splits /preview/{id}/{port}{rest}.
func parsePath(p string) (id string, port int, rest string, ok bool) {
	s, found := strings.CutPrefix(p, engine.PreviewPathPrefix)
	if !found {
		return "", 0, "", false
	}
	id, s, found = strings.Cut(s, "/")
	if !found || id == "" || strings.ContainsAny(id, ":[]%") {
		return "", 0, "", false
	}
	ps, rest, _ := strings.Cut(s, "/")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return "", 0, "", false
	}
	return id, port, "/" + rest, true
}

func writeError(w http.ResponseWriter, status int, code errdefs.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: string(code), Message: msg}})
}

// parseHost recognises the host-name form p{port}-{sandbox_id}.localhost,
// which gives each exposure an origin of its own (browsers resolve every
// name under localhost to the loopback).
func parseHost(host string) (id string, port int, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, found := strings.CutSuffix(strings.ToLower(host), engine.PreviewHostSuffix)
	if !found || !strings.HasPrefix(label, "p") || strings.Contains(label, ".") {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label[1:], "-")
	port, err := strconv.Atoi(ps)
	if !found || id == "" || err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return "", 0, false
	}
	return id, port, true
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// prefix is the path the exposure is served under: none in the
	// host-name form, /preview/{id}/{port} in the path form.
	var prefix, rest string
	id, port, ok := parseHost(r.Host)
	if ok {
		rest = r.URL.Path
		if rest == "" {
			rest = "/"
		}
	} else if id, port, rest, ok = parsePath(r.URL.Path); ok {
		prefix = engine.PreviewPathPrefix + id + "/" + strconv.Itoa(port)
	} else {
		writeError(w, http.StatusNotFound, errdefs.NotFound, "preview: no such path; exposed ports are served at "+engine.PreviewPathPrefix+"{sandbox_id}/{port}/")
		return
	}
	q := r.URL.Query()
	fromQuery := q.Get(apitypes.PreviewTokenParam)
	fromHeader := r.Header.Get(apitypes.PreviewTokenHeader)
	fromCookie := ""
	if c, err := r.Cookie(CookieName); err == nil {
		fromCookie = c.Value
	}
	// The first token present is the one checked.
	token, byCookie := fromHeader, false
	if token == "" {
		token = fromQuery
	}
	if token == "" {
		token, byCookie = fromCookie, true
	}
	if err := h.eng.AuthorizePreview(id, port, token); err != nil {
		writeError(w, http.StatusUnauthorized, errdefs.Unauthenticated, errdefs.MessageOf(err))
		return
	}
	if byCookie && isWebSocket(r) && !sameOrigin(r) {
		writeError(w, http.StatusForbidden, errdefs.PermissionDenied, "preview: a WebSocket with the preview cookie must come from the preview's own origin")
		return
	}
	if fromQuery != "" && fromHeader == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isWebSocket(r) {
		// A browser opening the exposure's URL: keep the token in a
		// cookie and send it on without the token in its address bar,
		// history and Referer.
		http.SetCookie(w, &http.Cookie{
			Name: CookieName, Value: fromQuery, Path: prefix + "/",
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil,
		})
		q.Del(apitypes.PreviewTokenParam)
		u := *r.URL
		u.RawQuery = q.Encode()
		if prefix != "" && rest == "/" && !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return
	}
	if prefix != "" && rest == "/" && !strings.HasSuffix(r.URL.Path, "/") {
		// Relative links of the page resolve against the trailing slash.
		u := *r.URL
		u.Path += "/"
		http.Redirect(w, r, u.RequestURI(), http.StatusMovedPermanently)
		return
	}
	out := r.Clone(r.Context())
	out.Header.Del(apitypes.PreviewTokenHeader)
	dropCookie(out.Header)
	q.Del(apitypes.PreviewTokenParam)
	out.URL = &url.URL{Scheme: "http", Host: net.JoinHostPort(id, strconv.Itoa(port)), Path: rest, RawQuery: q.Encode()}
	out.RequestURI = ""
	out.Host = r.Host                    // what the browser asked for; the app builds links on it
	out.Header.Del("X-Forwarded-Prefix") // only ours reaches the application
	if prefix != "" {
		out.Header.Set("X-Forwarded-Prefix", prefix)
	}
	h.proxy.ServeHTTP(w, out)
}

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// sameOrigin reports whether the request's Origin is the listener itself.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser: browsers always send Origin on WebSockets
	}
	u, err := url.Parse(o)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// dropCookie removes the preview cookie from the Cookie headers, keeping
// the application's own cookies.
func dropCookie(hd http.Header) {
	var keep []string
	for _, line := range hd.Values("Cookie") {
		var parts []string
		for _, c := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(c), "=")
			if name != CookieName && strings.TrimSpace(c) != "" {
				parts = append(parts, strings.TrimSpace(c))
			}
		}
		if len(parts) > 0 {
			keep = append(keep, strings.Join(parts, "; "))
		}
	}
	hd.Del("Cookie")
	for _, v := range keep {
		hd.Add("Cookie", v)
	}
}

// BaseURL is the address browsers reach a listener bound to addr at: an
// unspecified host becomes the IPv4 loopback.
func BaseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
