package network

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// KindCredential is the ledger kind of a sandbox's credential grants (key:
// the sandbox id); releasing it revokes them.
const KindCredential = "credential"

// DummyKey is the API key a granted sandbox's client is given: clients
// insist on having one, and the proxy replaces whatever the client sends.
const DummyKey = "sandbox-no-real-key-here"

// Credential is an upstream API the daemon holds the secret of
// (`network.credentials.NAME`).
type Credential struct {
	BaseURL *url.URL // the upstream, e.g. https://api.example/ (path kept as a prefix)
	Header  string   // the header the proxy sets, e.g. x-api-key
	// HeaderPrefix goes before the secret in the header ("Bearer ").
	HeaderPrefix string
	// SecretEnv / SecretFile: where the daemon reads the secret (the
	// daemon's environment, or a file of the daemon's, read per request
	// so that rotation needs no restart). Never from a request.
	SecretEnv, SecretFile string
	// BaseURLEnv and KeyEnv name the sandbox's variables: the proxy's URL
	// and the dummy key.
	BaseURLEnv, KeyEnv string
	// Spend caps per sandbox; 0: none.
	MaxRequests, MaxTokens int64
}

func (c Credential) secret() (string, error) {
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	v := os.Getenv(c.SecretEnv)
	if v == "" {
		return "", fmt.Errorf("environment variable %s of the daemon is empty", c.SecretEnv)
	}
	return v, nil
}

// CredentialUsage is what a sandbox did with one credential.
type CredentialUsage struct {
	Requests     int64 `json:"requests"`      // forwarded upstream
	InputTokens  int64 `json:"input_tokens"`  // from the responses' usage fields
	OutputTokens int64 `json:"output_tokens"` //
	Refused      int64 `json:"refused"`       // requests refused by the spend cap
	// CapReached names the cap that refused requests (max_requests,
	// max_tokens); empty while under both.
	CapReached string `json:"cap_reached,omitempty"`
}

// grant is one sandbox's use of one credential.
type grant struct {
	name  string
	cred  Credential
	usage CredentialUsage
}

// checkCredentials validates names against the configuration; field is the
// request's field name.
func checkCredentials(field string, names []string, mode Mode, defined map[string]Credential) error {
	if len(names) == 0 {
		return nil
	}
	if mode == ModeNone || mode == "" {
		return errdefs.Invalidf("%s: only valid with network egress or allowlist (the proxy is on the gateway)", field)
	}
	seen := map[string]bool{}
	for i, n := range names {
		if _, ok := defined[n]; !ok {
			known := slices.Sorted(maps.Keys(defined))
			return errdefs.Invalidf("%s[%d]: unknown credential %q (network.credentials defines: %s)", field, i, n, strings.Join(known, ", "))
		}
		if seen[n] {
			return errdefs.Invalidf("%s[%d]: credential %q named twice", field, i, n)
		}
		seen[n] = true
	}
	return nil
}

// credentialKey is the proxy's HMAC key for per-sandbox tokens, kept in
// run_dir so that a restarted daemon gives adopted sandboxes the same
// tokens. 0600, root's: a sandbox never sees it.
func credentialKey(runDir string) ([]byte, error) {
	p := filepath.Join(runDir, "credential-proxy.key")
	if b, err := os.ReadFile(p); err == nil && len(b) == 32 {
		return b, nil
	}
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p, k, 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// token is sandbox id's per-sandbox token.
func (m *Manager) token(id string) string {
	h := hmac.New(sha256.New, m.credKey)
	h.Write([]byte(id))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// credentialEnv is the environment of a sandbox granted names.
func (m *Manager) credentialEnv(id string, names []string) []string {
	var env []string
	for _, n := range names {
		c := m.cfg.Credentials[n]
		base := fmt.Sprintf("http://%s/%s/%s", net.JoinHostPort(m.gw.Addr().String(), strconv.Itoa(m.cfg.CredentialPort)), n, m.token(id))
		if c.BaseURLEnv != "" {
			env = append(env, c.BaseURLEnv+"="+base)
		}
		if c.KeyEnv != "" {
			env = append(env, c.KeyEnv+"="+DummyKey)
		}
	}
	return env
}

// grantLocked registers a sandbox's credentials (with m.dnsMu not held).
func (m *Manager) grantLocked(sb *sandboxNet) {
	m.dnsMu.Lock()
	defer m.dnsMu.Unlock()
	old := sb.grants
	sb.grants = map[string]*grant{}
	for _, n := range sb.req.Credentials {
		if g := old[n]; g != nil {
			sb.grants[n] = g // counters survive a policy change
			continue
		}
		sb.grants[n] = &grant{name: n, cred: m.cfg.Credentials[n]}
	}
}

// ReleaseCredential revokes sandbox id's credentials (the ledger's
// releaser of KindCredential). Idempotent.
func (m *Manager) ReleaseCredential(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sb := m.sandboxes[id]; sb != nil {
		m.dnsMu.Lock()
		sb.grants = nil
		m.dnsMu.Unlock()
	}
	return nil
}

// CredentialUsage reports a sandbox's use of its credentials, by name.
func (m *Manager) CredentialUsage(id string) map[string]CredentialUsage {
	m.mu.Lock()
	sb := m.sandboxes[id]
	m.mu.Unlock()
	if sb == nil {
		return nil
	}
	m.dnsMu.RLock()
	defer m.dnsMu.RUnlock()
	if len(sb.grants) == 0 {
		return nil
	}
	out := map[string]CredentialUsage{}
	for n, g := range sb.grants {
		out[n] = g.usage
	}
	return out
}

// credentialProxy is the egress proxy that adds credentials: an HTTP
// server on the gateway address (port network.credential_port) in the host
// namespace, forwarding to the configured upstreams.
//
// Security boundary: a sandbox never holds a secret; it holds the proxy's
// URL with a per-sandbox token in its path (an HMAC of the sandbox id under
// a key only the daemon has). A request is forwarded only if its source
// address is a sandbox's (the firewall drops spoofed sources: see
// firewall.go; sandboxes have no CAP_NET_RAW), that sandbox was granted the
// credential named in the path, AND the token in the path is that
// sandbox's. The secret is added here, after the client's own copy of the
// header is removed, and is never logged; the sandbox's requests and
// tokens are counted against its spend caps before anything is forwarded.
type credentialProxy struct {
	m   *Manager
	srv *http.Server
	log *slog.Logger
}

// startCredentialProxy listens on gw:port inside ns.
func startCredentialProxy(m *Manager, ns netns.NsHandle, gw netip.Addr, port int) (*credentialProxy, error) {
	addr := net.JoinHostPort(gw.String(), strconv.Itoa(port))
	var ln net.Listener
	if err := InNetNS(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("credential proxy on %s: %w", addr, err)
	}
	p := &credentialProxy{m: m, log: m.log}
	tr := &http.Transport{
		// Upstream connections are made in the host namespace (the
		// daemon's in production; the test's "host" namespace in tests).
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := InNetNS(ns, func() error {
				var err error
				c, err = (&net.Dialer{Timeout: 30 * time.Second}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        16,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	p.srv = &http.Server{Handler: p.handler(tr), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("credential proxy stopped", "err", err)
		}
	}()
	return p, nil
}

func (p *credentialProxy) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		p.srv.Close()
	}
}

// proxyError answers in the shape of the Anthropic API's errors, which
// other JSON clients read as well as any: {"type":"error","error":{...}}.
func proxyError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// resolve finds the grant of a request: source address, credential name,
// token. It returns the sandbox id and the grant, or an error message.
func (m *Manager) resolveGrant(src netip.Addr, name, token string) (string, *grant, string) {
	m.dnsMu.RLock()
	defer m.dnsMu.RUnlock()
	sb := m.byIP[src]
	if sb == nil {
		return "", nil, fmt.Sprintf("credential proxy: %s is not a sandbox", src)
	}
	g := sb.grants[name]
	if g == nil {
		return "", nil, fmt.Sprintf("credential proxy: sandbox %s was not granted credential %q", sb.id, name)
	}
	if !hmac.Equal([]byte(token), []byte(m.token(sb.id))) {
		return "", nil, fmt.Sprintf("credential proxy: wrong or missing per-sandbox token for credential %q", name)
	}
	return sb.id, g, ""
}

// admit counts a request against the caps; false (and the cap's name)
// when a cap is reached.
func (m *Manager) admit(g *grant) (bool, string) {
	m.dnsMu.Lock()
	defer m.dnsMu.Unlock()
	u := &g.usage
	reason := ""
	switch {
	case g.cred.MaxRequests > 0 && u.Requests >= g.cred.MaxRequests:
		reason = fmt.Sprintf("max_requests: %d of %d requests used", u.Requests, g.cred.MaxRequests)
	case g.cred.MaxTokens > 0 && u.InputTokens+u.OutputTokens >= g.cred.MaxTokens:
		reason = fmt.Sprintf("max_tokens: %d of %d tokens used", u.InputTokens+u.OutputTokens, g.cred.MaxTokens)
	}
	if reason != "" {
		u.Refused++
		u.CapReached, _, _ = strings.Cut(reason, ":")
		return false, reason
	}
	u.Requests++
	return true, ""
}

func (m *Manager) addTokens(g *grant, in, out int64) {
	m.dnsMu.Lock()
	g.usage.InputTokens += in
	g.usage.OutputTokens += out
	m.dnsMu.Unlock()
}

type proxyCtxKey struct{}

// proxyTarget travels in a request's context from the handler to the
// reverse proxy's hooks.
type proxyTarget struct {
	id     string
	g      *grant
	rest   string
	secret string
	start  time.Time
}

func (p *credentialProxy) handler(tr http.RoundTripper) http.Handler {
	rp := &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1, // streams (SSE) pass at once
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(proxyCtxKey{}).(*proxyTarget)
			base := t.g.cred.BaseURL
			pr.Out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host,
				Path: strings.TrimSuffix(base.Path, "/") + t.rest, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = base.Host
			// The client's copy of the header (the dummy key) and any
			// other way of passing a key are replaced.
			pr.Out.Header.Del(t.g.cred.Header)
			pr.Out.Header.Set(t.g.cred.Header, t.g.cred.HeaderPrefix+t.secret)
		},
		ModifyResponse: func(resp *http.Response) error {
			t := resp.Request.Context().Value(proxyCtxKey{}).(*proxyTarget)
			sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
			resp.Body = &usageBody{rc: resp.Body, sse: sse, done: func(in, out int64) {
				p.m.addTokens(t.g, in, out)
				p.log.Info("credential proxy: request", "sandbox", t.id, "credential", t.g.name,
					"method", resp.Request.Method, "path", t.rest, "status", resp.StatusCode,
					"input_tokens", in, "output_tokens", out, "duration", time.Since(t.start).Round(time.Millisecond))
			}}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(proxyCtxKey{}).(*proxyTarget)
			p.log.Warn("credential proxy: upstream failed", "sandbox", t.id, "credential", t.g.name, "path", t.rest, "err", err)
			proxyError(w, http.StatusBadGateway, "api_error", "credential proxy: upstream unreachable")
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		src, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			proxyError(w, http.StatusForbidden, "permission_error", "credential proxy: unknown source")
			return
		}
		// Path: /NAME/TOKEN/rest...
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
		for len(parts) < 3 {
			parts = append(parts, "")
		}
		id, g, refusal := p.m.resolveGrant(src.Addr().Unmap(), parts[0], parts[1])
		if refusal != "" {
			p.log.Warn("credential proxy: refused", "source", src.Addr().String(), "credential", parts[0], "reason", refusal)
			proxyError(w, http.StatusForbidden, "permission_error", refusal)
			return
		}
		if ok, reason := p.m.admit(g); !ok {
			msg := fmt.Sprintf("credential proxy: spend cap of sandbox %s for credential %q reached (%s)", id, g.name, reason)
			p.log.Warn("credential proxy: spend cap", "sandbox", id, "credential", g.name, "cap", reason)
			proxyError(w, http.StatusForbidden, "permission_error", msg)
			return
		}
		secret, err := g.cred.secret()
		if err != nil {
			p.log.Error("credential proxy: secret unavailable", "credential", g.name, "err", err)
			proxyError(w, http.StatusBadGateway, "api_error", fmt.Sprintf("credential proxy: the daemon has no secret for credential %q", g.name))
			return
		}
		t := &proxyTarget{id: id, g: g, rest: "/" + parts[2], secret: secret, start: time.Now()}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), proxyCtxKey{}, t)))
	})
}

// usageBody passes a response through and reads its token usage: from
// every SSE event's `usage` or `message.usage` (streams), or from the JSON
// body's `usage` (kept up to maxUsageBody). Input and output are the
// largest values seen (the Messages API repeats cumulative counts).
type usageBody struct {
	rc      io.ReadCloser
	sse     bool
	buf     bytes.Buffer // JSON body, or the SSE line being assembled
	in, out int64
	done    func(in, out int64)
	once    sync.Once
}

const maxUsageBody = 4 << 20

type usageFields struct {
	Usage *struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	Message *struct {
		Usage *struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	} `json:"message"`
}

func (b *usageBody) take(j []byte) {
	var f usageFields
	if json.Unmarshal(j, &f) != nil {
		return
	}
	if f.Usage != nil {
		b.in, b.out = max(b.in, f.Usage.InputTokens), max(b.out, f.Usage.OutputTokens)
	}
	if f.Message != nil && f.Message.Usage != nil {
		b.in, b.out = max(b.in, f.Message.Usage.InputTokens), max(b.out, f.Message.Usage.OutputTokens)
	}
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if b.buf.Len()+n <= maxUsageBody {
		b.buf.Write(p[:n])
	}
	if b.sse {
		// Consume whole lines; keep a partial one.
		for {
			i := bytes.IndexByte(b.buf.Bytes(), '\n')
			if i < 0 {
				break
			}
			line := bytes.TrimSpace(b.buf.Next(i + 1))
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				b.take(bytes.TrimSpace(d))
			}
		}
	}
	if err == io.EOF {
		b.finish()
	}
	return n, err
}

func (b *usageBody) finish() {
	b.once.Do(func() {
		if !b.sse {
			b.take(b.buf.Bytes())
		} else if rest := bytes.TrimSpace(b.buf.Bytes()); len(rest) > 0 {
			sc := bufio.NewScanner(bytes.NewReader(rest))
			for sc.Scan() {
				if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:")); ok {
					b.take(bytes.TrimSpace(d))
				}
			}
		}
		b.done(b.in, b.out)
	})
}

func (b *usageBody) Close() error {
	b.finish()
	return b.rc.Close()
}
