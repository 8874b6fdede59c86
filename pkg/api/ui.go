package api

import (
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/webui"
)

// The web editor's page: the bundle of pkg/webui, served at / to callers
// that passed authenticate (auth.go). It talks to the daemon only through
// the public API under /v1, like sandboxctl.

// uiCSP is the editor's Content-Security-Policy: every asset from the
// daemon itself (no CDN), no inline scripts. Monaco injects <style> elements
// and runs its diff worker from the bundle, hence 'unsafe-inline' styles
// and worker-src 'self'.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// loginCSP is the login page's: no script at all.
const loginCSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(h http.Header, csp string) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// The login URL carries a token: never leak an address in a Referer.
	h.Set("Referrer-Policy", "no-referrer")
}

// ui serves the bundle: / is index.html, the rest its assets.
func (s *server) ui(w http.ResponseWriter, r *http.Request) { ServeWebUI(w, r) }

// ServeWebUI serves the web editor's bundle (pkg/webui) with its security
// headers: / is index.html, the rest its assets. The gateway serves the
// same page (pkg/gateway/ui.go).
func ServeWebUI(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header(), uiCSP)
	if !webui.Built() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("The web editor was not built into this binary: run `make build`.\n"))
		return
	}
	// Asset names carry no content hash: browsers revalidate every time
	// (cheap on loopback) and never run a stale bundle after an upgrade.
	w.Header().Set("Cache-Control", "no-cache")
	files := webui.Files()
	// The build stores a gzipped copy of each asset beside it.
	name := strings.TrimPrefix(path.Clean(r.URL.Path), "/")
	if strings.HasPrefix(name, "assets/") && !strings.HasSuffix(name, ".gz") {
		w.Header().Set("Vary", "Accept-Encoding")
		if _, err := fs.Stat(files, name+".gz"); err == nil && acceptsGzip(r) {
			if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
				w.Header().Set("Content-Type", ct)
			}
			w.Header().Set("Content-Encoding", "gzip")
			http.ServeFileFS(w, r, files, name+".gz")
			return
		}
	}
	http.FileServerFS(files).ServeHTTP(w, r)
}

// acceptsGzip says whether the client takes gzip (a q=0 refusal aside).
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			return strings.ReplaceAll(params, " ", "") != "q=0"
		}
	}
	return false
}

var loginTmpl = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mcp-sandboxd — log in</title>
<meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,">
<style>
body{font:15px system-ui,sans-serif;background:#1e1e1e;color:#ddd;display:flex;justify-content:center;margin-top:15vh}
main{max-width:32em} code{background:#333;padding:1px 4px} input{width:22em;padding:4px}
.err{color:#f48771}
</style></head>
<body><main id="login">
<h1>mcp-sandboxd web editor</h1>
{{if .}}<p class="err" id="login-error">{{.}}</p>{{end}}
<p>Open the URL that <code>sandboxctl ui</code> prints, or paste its token:</p>
<form method="post" action="/login"><input name="token" type="password" autocomplete="off" aria-label="login token">
<button type="submit">Log in</button></form>
</main></body></html>
`))

// loginPage answers with the login page: the only page an unauthenticated
// browser gets.
func (s *server) loginPage(w http.ResponseWriter, status int, msg string) { LoginPage(w, status, msg) }

// LoginPage answers with the web editor's login page and msg (the
// gateway's too).
func LoginPage(w http.ResponseWriter, status int, msg string) {
	securityHeaders(w.Header(), loginCSP)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = loginTmpl.Execute(w, msg)
}

// systemInfo is GET /v1/system.
type systemInfo = apitypes.SystemInfo

// features maps a feature to the route that provides it.
var features = map[string]string{
	"autofix":    "POST /v1/autofix",
	"run_stream": "POST /v1/run",
	"terminal":   "GET /v1/sandboxes/x/terminal",
	"export":     "POST /v1/sandboxes/x/export",
	"web_editor": "GET /login",
}

func (s *server) system(w http.ResponseWriter, r *http.Request) {
	info := systemInfo{Version: version.Version, Commit: version.Commit, Features: map[string]bool{}}
	for name, route := range features {
		method, path, _ := strings.Cut(route, " ")
		probe, err := http.NewRequestWithContext(r.Context(), method, path, nil)
		if err != nil {
			panic(err) // constant, valid routes
		}
		_, pattern := s.mux.Handler(probe)
		info.Features[name] = pattern != ""
	}
	info.Features["web_editor"] = info.Features["web_editor"] && s.opt.UI != nil && webui.Built()
	writeJSON(w, http.StatusOK, info)
}
