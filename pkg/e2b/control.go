package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// defaultTimeout is E2B's sandbox timeout when a create gives none (the
// SDKs send 300).
const defaultTimeout = 300

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

func (s *Server) controlPlane() http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		mux.HandleFunc("POST "+p, s.create)
	}
	mux.HandleFunc("GET /sandboxes", s.listV1)
	mux.HandleFunc("GET /v2/sandboxes", s.list)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout("timeout"))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.setTimeout("duration"))
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.connect)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("GET /templates", s.templates)
	health := func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "Health check successful\n") }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			health(w, r)
			return
		}
		if p, ok, err := s.gatewayPrincipal(r); ok || err != nil {
			if err != nil {
				writeErr(w, err)
				return
			}
			audit.CallFrom(r.Context()).SetPrincipal(p)
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			ctx := principal.WithOrigin(principal.With(r.Context(), p), principal.Origin{FrontEnd: "gateway", Source: r.RemoteAddr})
			telemetry.SetCaller(ctx, p)
			mux.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		key := r.Header.Get("X-Api-Key")
		if key == "" {
			writeError(w, http.StatusUnauthorized, "missing X-API-Key header")
			return
		}
		p, err := s.opt.Auth.Authenticate(key, r.RemoteAddr)
		if errdefs.Is(err, errdefs.LimitExceeded) {
			writeErr(w, err)
			return
		}
		if err != nil {
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		audit.CallFrom(r.Context()).SetPrincipal(keyPrincipal(key))
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		ctx := principal.WithOrigin(principal.With(r.Context(), p), principal.Origin{FrontEnd: "e2b", Source: r.RemoteAddr})
		telemetry.SetCaller(ctx, p)
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// newSandbox is the body of POST /sandboxes (E2B's NewSandbox); unknown
// fields are ignored as E2B's own server does.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
}

// sandboxJSON is E2B's Sandbox, SandboxDetail and ListedSandbox in one:
// every field any of them requires is present.
type sandboxJSON struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	Alias           string            `json:"alias,omitempty"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken *string           `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
}

func (s *Server) describe(sb *apitypes.Sandbox, withToken bool) sandboxJSON {
	out := sandboxJSON{
		TemplateID: sb.Labels[labelTemplate], SandboxID: ToE2B(sb.ID), ClientID: clientID,
		Alias: sb.Labels[labelTemplate], EnvdVersion: EnvdVersion, StartedAt: sb.CreatedAt,
		CPUCount: max(1, int(sb.Limits.CPUs+0.5)), MemoryMB: sb.Limits.MemoryBytes >> 20,
		DiskSizeMB: sb.Limits.DiskBytes >> 20, State: "running", Metadata: map[string]string{},
	}
	if s.opt.Domain != "" {
		d := s.opt.Domain
		out.Domain = &d
	}
	if sb.ExpiresAt != nil {
		out.EndAt = *sb.ExpiresAt
	}
	if sb.State == apitypes.StatePaused {
		out.State = "paused"
	}
	if tok := sb.Labels[labelToken]; tok != "" && withToken {
		out.EnvdAccessToken = &tok
	}
	for k, v := range sb.Labels {
		if m, ok := strings.CutPrefix(k, metaPrefix); ok {
			out.Metadata[m] = v
		}
	}
	return out
}

// isE2B reports whether sb was created through this front end.
func isE2B(sb *apitypes.Sandbox) bool { return sb.Labels[labelTemplate] != "" }

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req newSandbox
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "body: invalid JSON: %v", err)
		return
	}
	if req.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID: required")
		return
	}
	if strings.ContainsAny(req.TemplateID, "/:") {
		// name:tag and namespace/name refs: our images have neither.
		writeError(w, http.StatusNotFound, "templateID: template %q not found (templates are the daemon's images, GET /templates)", req.TemplateID)
		return
	}
	timeout := int64(defaultTimeout)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		// Said here, naming E2B's field: the engine refuses it too, as
		// ttl_seconds, a name this API's clients never wrote.
		writeError(w, http.StatusBadRequest, "timeout: must be a positive number of seconds, got %d", timeout)
		return
	}
	labels := map[string]string{labelTemplate: req.TemplateID}
	for k, v := range req.Metadata {
		labels[metaPrefix+k] = v
	}
	if req.Secure == nil || *req.Secure {
		var b [16]byte
		_, _ = rand.Read(b[:])
		labels[labelToken] = hex.EncodeToString(b[:])
	}
	cr := apitypes.CreateSandboxRequest{Image: req.TemplateID, Env: req.EnvVars, Labels: labels,
		TTLSeconds: &timeout, Root: true, RootAsUser: true, PauseOnExpiry: req.AutoPause != nil && *req.AutoPause}
	// A template of the daemon's (template_create) by that name wins over
	// an image: its image, defaults and start command, ready on return.
	image := req.TemplateID
	if t, err := s.template(r.Context(), req.TemplateID); err != nil {
		writeErr(w, err)
		return
	} else if t != nil {
		cr.Image, cr.Template, image = "", t.Name, t.Image
	}
	if req.AllowInternetAccess != nil {
		cr.Network = "none"
		if *req.AllowInternetAccess {
			cr.Network = "egress"
		}
	}
	sb, err := s.b.CreateSandbox(r.Context(), cr)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.InvalidArgument && strings.Contains(errdefs.MessageOf(err), "unknown image") {
			writeError(w, http.StatusNotFound, "templateID: template %q not found (%s)", req.TemplateID, errdefs.MessageOf(err))
			return
		}
		writeErr(w, err)
		return
	}
	if image != "base" {
		if err := s.makeHome(r.Context(), sb.ID); err != nil {
			_, _ = s.b.TerminateSandbox(context.WithoutCancel(r.Context()), sb.ID)
			writeErr(w, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, s.describe(sb, true))
}

// makeHome gives an image other than base (whose user is user) the home
// E2B code expects: /home/user, owned by uid 1000.
func (s *Server) makeHome(ctx context.Context, id string) error {
	p, err := s.b.OpenProcess(ctx, apitypes.ProcessRequest{SandboxID: id, Root: true, Cwd: "/", TimeoutSeconds: 30,
		Argv: []string{"/bin/sh", "-c", "[ -d /home/user ] || { mkdir -p /home/user && chown 1000:1000 /home/user; }"}})
	if err != nil {
		return err
	}
	_ = p.CloseStdin()
	var out []byte
	for c := range p.Chunks() {
		out = append(out, c.Data...)
	}
	res, err := p.Wait()
	if err != nil {
		return err
	}
	if res.Termination.Cause != apitypes.CauseExited || res.ExitCode != 0 {
		return errdefs.New(errdefs.Internal, "templateID: could not make /home/user in the image: %s %s", res.Termination.Cause, strings.TrimSpace(string(out)))
	}
	return nil
}

// lookup finds a live E2B sandbox by its E2B id; it answers the request
// (404) and returns nil when there is none.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) *apitypes.SandboxDetail {
	e := r.PathValue("id")
	id, ok := FromE2B(e)
	if !ok {
		writeError(w, http.StatusNotFound, "sandbox %q not found", e)
		return nil
	}
	sb, err := s.b.GetSandbox(r.Context(), id)
	if err != nil || !sb.State.Live() || !isE2B(&sb.Sandbox) {
		if err != nil && errdefs.CodeOf(err) != errdefs.NotFound && errdefs.CodeOf(err) != errdefs.InvalidArgument {
			writeErr(w, err)
			return nil
		}
		writeError(w, http.StatusNotFound, "sandbox %q not found", e)
		return nil
	}
	return sb
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	if sb := s.lookup(w, r); sb != nil {
		writeJSON(w, http.StatusOK, s.describe(&sb.Sandbox, true))
	}
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sb := s.lookup(w, r)
	if sb == nil {
		return
	}
	if _, err := s.b.TerminateSandbox(r.Context(), sb.ID); err != nil {
		writeErr(w, err)
		return
	}
	s.procs.dropSandbox(sb.ID)
	s.watch.dropSandbox(sb.ID)
	s.mu.Lock()
	delete(s.cpu, sb.ID)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

type timeoutBody struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
}

func decodeTimeout(w http.ResponseWriter, r *http.Request, field string) (int64, bool) {
	var b timeoutBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && err != io.EOF {
		writeError(w, http.StatusBadRequest, "body: invalid JSON: %v", err)
		return 0, false
	}
	v := b.Timeout
	if field == "duration" {
		v = b.Duration
	}
	if v == nil {
		writeError(w, http.StatusBadRequest, "%s: required (seconds)", field)
		return 0, false
	}
	if *v <= 0 {
		writeError(w, http.StatusBadRequest, "%s: must be a positive number of seconds, got %d", field, *v)
		return 0, false
	}
	return *v, true
}

// setTimeout sets a sandbox's TTL from now: POST /sandboxes/{id}/timeout
// reads it from "timeout", the older /refreshes from "duration".
func (s *Server) setTimeout(field string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb := s.lookup(w, r)
		if sb == nil {
			return
		}
		secs, ok := decodeTimeout(w, r, field)
		if !ok {
			return
		}
		if _, err := s.b.SetSandboxTimeout(r.Context(), sb.ID, secs); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	sb := s.lookup(w, r)
	if sb == nil {
		return
	}
	if sb.State == apitypes.StatePaused {
		writeError(w, http.StatusConflict, "sandbox %q is already paused", ToE2B(sb.ID))
		return
	}
	if _, err := s.b.PauseSandbox(r.Context(), sb.ID); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect resumes a paused sandbox (201) or finds a running one (200), and
// extends its timeout when the new one ends later.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	sb := s.lookup(w, r)
	if sb == nil {
		return
	}
	var b timeoutBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && err != io.EOF {
		writeError(w, http.StatusBadRequest, "body: invalid JSON: %v", err)
		return
	}
	status := http.StatusOK
	info := &sb.Sandbox
	if sb.State == apitypes.StatePaused {
		var err error
		if info, err = s.b.ResumeSandbox(r.Context(), sb.ID); err != nil {
			writeErr(w, err)
			return
		}
		status = http.StatusCreated
		if b.Timeout == nil || *b.Timeout <= 0 {
			// Paused by its timeout (autoPause): resumed, it gets
			// E2B's default time again rather than being paused anew.
			d := int64(defaultTimeout)
			b.Timeout = &d
		}
	}
	if b.Timeout != nil && *b.Timeout > 0 {
		if info.ExpiresAt == nil || time.Now().Add(time.Duration(*b.Timeout)*time.Second).After(*info.ExpiresAt) {
			var err error
			if info, err = s.b.SetSandboxTimeout(r.Context(), sb.ID, *b.Timeout); err != nil {
				writeErr(w, err)
				return
			}
		}
	}
	writeJSON(w, status, s.describe(info, true))
}

// listV1 is the list of SDKs before 2.0: running sandboxes, no paging.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	all, err := s.filtered(r.Context(), []string{"running"}, nil)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]sandboxJSON, len(all))
	for i, sb := range all {
		out[i] = s.describe(sb, false)
	}
	writeJSON(w, http.StatusOK, out)
}

// list is GET /v2/sandboxes: state and metadata filters, limit and
// nextToken paging (the token is the last id of the page before).
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var states []string
	if st := q.Get("state"); st != "" {
		for _, x := range strings.Split(st, ",") {
			if x != "running" && x != "paused" {
				writeError(w, http.StatusBadRequest, "state: %q is not running or paused", x)
				return
			}
			states = append(states, x)
		}
	}
	meta, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "metadata: %v", err)
		return
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit: must be 1 to 100, got %q", l)
			return
		}
		limit = n
	}
	all, err := s.filtered(r.Context(), states, meta)
	if err != nil {
		writeErr(w, err)
		return
	}
	if tok := q.Get("nextToken"); tok != "" {
		i := slices.IndexFunc(all, func(sb *apitypes.Sandbox) bool { return ToE2B(sb.ID) > tok })
		if i < 0 {
			i = len(all)
		}
		all = all[i:]
	}
	if len(all) > limit {
		all = all[:limit]
		w.Header().Set("X-Next-Token", ToE2B(all[limit-1].ID))
	}
	out := make([]sandboxJSON, len(all))
	for i, sb := range all {
		out[i] = s.describe(sb, false)
	}
	writeJSON(w, http.StatusOK, out)
}

// parseMetadataQuery decodes the SDKs' metadata filter: a URL-encoded
// k=v&k2=v2 whose keys and values are encoded again.
func parseMetadataQuery(m string) (map[string]string, error) {
	if m == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(m, "&") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, errdefs.Invalidf("%q is not key=value", kv)
		}
		dk, err1 := url.QueryUnescape(k)
		dv, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			return nil, errdefs.Invalidf("%q is not URL-encoded", kv)
		}
		out[dk] = dv
	}
	return out, nil
}

// filtered lists the live E2B sandboxes in states (none: all) whose
// metadata has meta, ordered by E2B id.
func (s *Server) filtered(ctx context.Context, states []string, meta map[string]string) ([]*apitypes.Sandbox, error) {
	all, err := s.b.ListSandboxes(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []*apitypes.Sandbox
	for _, sb := range all {
		if !isE2B(sb) || !sb.State.Live() || sb.State == apitypes.StateCreating {
			continue
		}
		st := "running"
		if sb.State == apitypes.StatePaused {
			st = "paused"
		}
		if len(states) > 0 && !slices.Contains(states, st) {
			continue
		}
		match := true
		for k, v := range meta {
			if got, ok := sb.Labels[metaPrefix+k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *apitypes.Sandbox) int { return strings.Compare(ToE2B(a.ID), ToE2B(b.ID)) })
	return out, nil
}

// cpuSample is a sandbox's CPU time at an instant, for cpuUsedPct.
type cpuSample struct {
	at  time.Time
	cpu float64
}

type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics answers with one sample, now: CPU use is the share of the
// sandbox's CPUs used since the previous sample (or since its start).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb := s.lookup(w, r)
	if sb == nil {
		return
	}
	now := time.Now()
	m := metricJSON{Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: max(1, int(sb.Limits.CPUs+0.5)),
		MemTotal: sb.Limits.MemoryBytes, DiskTotal: sb.Limits.DiskBytes}
	if u := sb.Usage; u != nil {
		m.MemUsed, m.DiskUsed = u.MemoryBytes, u.DiskBytes
		s.mu.Lock()
		prev, ok := s.cpu[sb.ID]
		s.cpu[sb.ID] = cpuSample{at: now, cpu: u.CPUSeconds}
		s.mu.Unlock()
		if !ok {
			prev = cpuSample{at: sb.CreatedAt}
		}
		if dt := now.Sub(prev.at).Seconds(); dt > 0 && sb.Limits.CPUs > 0 {
			m.CPUUsedPct = min(100, 100*(u.CPUSeconds-prev.cpu)/dt/sb.Limits.CPUs)
		}
	}
	writeJSON(w, http.StatusOK, []metricJSON{m})
}

type templateJSON struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	Aliases     []string  `json:"aliases"`
	Names       []string  `json:"names"`
	Public      bool      `json:"public"`
	BuildStatus string    `json:"buildStatus"`
	CPUCount    int       `json:"cpuCount"`
	MemoryMB    int64     `json:"memoryMB"`
	DiskSizeMB  int64     `json:"diskSizeMB"`
	EnvdVersion string    `json:"envdVersion"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// template finds the daemon's template name (nil when there is none).
func (s *Server) template(ctx context.Context, name string) (*apitypes.Template, error) {
	l, err := s.b.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for i := range l.Templates {
		if l.Templates[i].Name == name {
			return &l.Templates[i], nil
		}
	}
	return nil, nil
}

// templates lists the daemon's templates (template_create) and images,
// built or not (an unbuilt one is built on its first sandbox).
func (s *Server) templates(w http.ResponseWriter, r *http.Request) {
	l, err := s.b.ImageList(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	tl, err := s.b.ListTemplates(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []templateJSON{}
	for _, t := range tl.Templates {
		tj := templateJSON{TemplateID: t.Name, BuildID: t.Image, Aliases: []string{t.Name}, Names: []string{t.Name},
			Public: true, BuildStatus: "ready", CPUCount: 1, EnvdVersion: EnvdVersion, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt}
		if t.CPUs != nil {
			tj.CPUCount = max(1, int(*t.CPUs))
		}
		if t.MemoryMB != nil {
			tj.MemoryMB = *t.MemoryMB
		}
		if t.DiskMB != nil {
			tj.DiskSizeMB = *t.DiskMB
		}
		out = append(out, tj)
	}
	for _, im := range l.Images {
		out = append(out, templateJSON{TemplateID: im.Name, BuildID: im.Digest, Aliases: []string{im.Name}, Names: []string{im.Name},
			Public: true, BuildStatus: "ready", CPUCount: 1, EnvdVersion: EnvdVersion, CreatedAt: im.BuiltAt, UpdatedAt: im.BuiltAt})
	}
	for _, rc := range l.Unbuilt {
		if rc.VM {
			continue
		}
		out = append(out, templateJSON{TemplateID: rc.Name, Aliases: []string{rc.Name}, Names: []string{rc.Name},
			Public: true, BuildStatus: "waiting", CPUCount: 1, EnvdVersion: EnvdVersion})
	}
	writeJSON(w, http.StatusOK, out)
}
