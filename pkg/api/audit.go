package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The REST front end's part of the audit log (pkg/audit): auditCalls wraps
// the handler chain above authentication, so that a 401 is recorded as an
// authentication failure and every request that changes anything is
// recorded — on disk — before its status is sent; auditWho, below
// authentication, names the caller. MCP requests on /mcp are recorded by
// pkg/mcpserver per tool call (every MCP message is a POST), except their
// authentication failures, which only this layer sees.

// auditCalls records the requests of this listener (nil log: next itself).
func (s *server) auditCalls(next http.Handler) http.Handler {
	fe := "rest"
	if !s.tcp() {
		fe = "socket"
	}
	return s.opt.Audit.HTTP(fe, s.classify, next)
}

// tcp says whether this is the TCP listener (it authenticates), not the
// unix socket.
func (s *server) tcp() bool { return s.opt.Auth != nil || s.opt.Token != "" }

// classify names a request's action (its route) and target (the route's
// wildcards: a sandbox id, an image name, a job).
func (s *server) classify(r *http.Request) audit.Classification {
	if r.URL.Path == "/mcp" || strings.HasPrefix(r.URL.Path, "/mcp/") {
		return audit.Classification{Action: r.Method + " /mcp", FrontEnd: "mcp"}
	}
	var k audit.Classification
	_, pattern := s.mux.Handler(r)
	if pattern == "" || pattern == "/" {
		k.Action = r.Method + " " + r.URL.Path
	} else {
		k.Action = pattern
		k.Target = wildcards(pattern, r.URL.Path)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		// A terminal is a shell in the sandbox; a login opens a session.
		k.Changes = strings.HasSuffix(pattern, "/terminal") && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") ||
			r.URL.Path == "/login" && r.URL.Query().Get("token") != ""
		if r.URL.Path == "/login" {
			k.Action = r.Method + " /login" // never the token
		}
	default:
		k.Changes = true
	}
	return k
}

// wildcards returns the values of a route pattern's {wildcards} in path,
// joined by "/".
func wildcards(pattern, path string) string {
	_, pat, _ := strings.Cut(pattern, " ")
	ps, xs := strings.Split(strings.Trim(pat, "/"), "/"), strings.Split(strings.Trim(path, "/"), "/")
	var vals []string
	for i, p := range ps {
		if !strings.HasPrefix(p, "{") || i >= len(xs) {
			continue
		}
		if strings.HasSuffix(p, "...}") {
			vals = append(vals, strings.Join(xs[i:], "/"))
			break
		}
		vals = append(vals, xs[i])
	}
	return strings.Join(vals, "/")
}

// auditWho names the authenticated caller for the audit record, and puts
// it on the request's context (pkg/principal) for the layers below (MCP
// tool calls, traces). A principal an earlier layer attached wins.
func (s *server) auditWho(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := callerOf(r)
		p, ok := principal.From(r.Context())
		o := principal.OriginFrom(r.Context())
		// The open routes of the TCP listener (/login, /healthz) pass
		// authentication without a caller: nobody is named.
		anonymous := !ok && s.tcp() && c.kind == callerSocket
		if !ok && !anonymous {
			switch c.kind {
			case callerBearer:
				p = principal.Principal{KeyName: "admin-token", Admin: true}
			case callerBrowser:
				p = principal.Principal{KeyName: "web-session", Admin: true}
			default:
				p = principal.Socket
			}
		}
		if o.FrontEnd == "" {
			o = principal.Origin{FrontEnd: "rest", Source: r.RemoteAddr}
			switch {
			case !s.tcp():
				o = principal.Origin{FrontEnd: "socket", Source: "unix"}
			case c.kind == callerBrowser:
				o.FrontEnd = "web"
			}
			if r.URL.Path == "/mcp" || strings.HasPrefix(r.URL.Path, "/mcp/") {
				o.FrontEnd = "mcp"
			}
		}
		call := audit.CallFrom(r.Context())
		call.SetOrigin(o)
		ctx := principal.WithOrigin(r.Context(), o)
		if !anonymous {
			call.SetPrincipal(p)
			ctx = principal.With(ctx, p)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// routeAudit registers the audit endpoints (admin only).
func (s *server) routeAudit(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/audit/verify", s.auditVerify)
	mux.HandleFunc("GET /v1/audit/export", s.auditExport)
}

// auditAdmin refuses a caller that is not an administrator, and answers
// unavailable when the log is off.
func (s *server) auditAdmin(w http.ResponseWriter, r *http.Request) bool {
	if p, ok := principal.From(r.Context()); !ok || !p.Admin {
		s.writeError(w, r, errdefs.PermissionDeniedf("audit: only an admin key may read the audit log"))
		return false
	}
	if s.opt.Audit == nil {
		s.writeError(w, r, errdefs.Unavailablef("audit: the audit log is off (audit.enabled is false)"))
		return false
	}
	return true
}

// auditVerify is GET /v1/audit/verify: the chain and its checkpoints.
func (s *server) auditVerify(w http.ResponseWriter, r *http.Request) {
	if !s.auditAdmin(w, r) {
		return
	}
	rep, err := s.opt.Audit.Verify(r.Context())
	s.reply(w, r, http.StatusOK, rep, err)
}

// auditExport is GET /v1/audit/export?since=: OCSF API Activity JSON lines.
func (s *server) auditExport(w http.ResponseWriter, r *http.Request) {
	if !s.auditAdmin(w, r) {
		return
	}
	since, err := audit.ParseSince(r.URL.Query().Get("since"), time.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	if _, err := s.opt.Audit.Export(r.Context(), since, w); err != nil {
		s.log.Warn("audit export", "err", err)
	}
}

// auditCreated names the sandbox a create made as the record's target (the
// route has no id to take it from).
func auditCreated(r *http.Request, sb *apitypes.Sandbox, err error) {
	if err == nil && sb != nil {
		audit.CallFrom(r.Context()).SetTarget(sb.ID)
	}
}
