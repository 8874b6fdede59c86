package engine

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Preview ports: a sandbox's TCP port served on the daemon's preview
// listener (pkg/preview) at /preview/{sandbox_id}/{port}/, through the
// sandbox's agent (sandbox.Manager.DialPort), behind a token of the
// exposure's own.
//
// Security boundary: a preview request reaches a sandbox only if its port
// is exposed here and the request carries that exposure's token (compared
// in constant time); nothing else in the sandbox is reachable through the
// preview listener, and the token grants nothing but that port (not the
// API). Exposures are kept in memory and in SQLite (port_exposures), so
// they survive a daemon restart with their sandboxes; they end with their
// sandbox (every transition to terminated or failed drops them, whatever
// caused it; at startup the rows of sandboxes no longer live are removed)
// and on UnexposePort.

// ExposePortRequest asks for a sandbox's port to be served.
type ExposePortRequest = apitypes.ExposePortRequest

// PreviewPathPrefix is where the preview listener serves exposures.
const PreviewPathPrefix = "/preview/"

// PreviewHostSuffix ends the host-name form of an exposure's address,
// p{port}-{sandbox_id}.localhost: browsers resolve every name under
// localhost to the loopback, so each exposure gets an origin of its own
// when the listener is on the loopback.
const PreviewHostSuffix = ".localhost"

// maxExposuresPerSandbox bounds one sandbox's exposures (and the tokens the
// daemon keeps).
const maxExposuresPerSandbox = 16

type portKey struct {
	sandbox string
	port    int
}

// portExposures is the table of exposed ports.
type portExposures struct {
	mu      sync.Mutex
	baseURL string // the preview listener's address; "" until it listens
	m       map[portKey]exposure
}

type exposure struct {
	token   string
	created time.Time
}

// public describes an exposure with the listener's current address (it may
// change across restarts: port 0).
func (p *portExposures) public(k portKey, x exposure) apitypes.PortExposure {
	base := fmt.Sprintf("%s%s%s/%d/", p.baseURL, PreviewPathPrefix, k.sandbox, k.port)
	query := "?" + url.Values{apitypes.PreviewTokenParam: {x.token}}.Encode()
	out := apitypes.PortExposure{
		SandboxID: k.sandbox, Port: k.port,
		URL: base + query, BaseURL: base, Token: x.token, TokenHeader: apitypes.PreviewTokenHeader,
		CreatedAt: x.created,
	}
	if u, err := url.Parse(p.baseURL); err == nil {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || ip != nil && ip.IsLoopback() {
			u.Host = net.JoinHostPort(fmt.Sprintf("p%d-%s%s", k.port, k.sandbox, PreviewHostSuffix), u.Port())
			out.HostURL = u.String() + "/" + query
		}
	}
	return out
}

// SetPreviewURL records the address browsers reach the preview listener at
// (http://host:port), once it listens; exposures before that are refused.
func (e *Engine) SetPreviewURL(base string) {
	e.ports.mu.Lock()
	defer e.ports.mu.Unlock()
	e.ports.baseURL = base
}

// ExposePort serves the sandbox's port on the preview listener and returns
// the URL and token. Exposing an exposed port returns the existing
// exposure; nothing needs to listen on the port yet.
func (e *Engine) ExposePort(ctx context.Context, req ExposePortRequest) (*apitypes.PortExposure, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := agent.ValidatePort(req.Port); err != nil {
		return nil, errdefs.Invalidf("port: %d is not in 1-65535", req.Port)
	}
	if err := e.checkExposable(ctx, req.SandboxID); err != nil {
		return nil, err
	}
	p := &e.ports
	p.mu.Lock()
	if p.baseURL == "" {
		p.mu.Unlock()
		return nil, errdefs.Unavailablef("port: no preview listener (server.preview_listen is empty, or its address could not be opened)")
	}
	key := portKey{req.SandboxID, req.Port}
	x, ok := p.m[key]
	fresh := !ok
	if fresh {
		n := 0
		for k := range p.m {
			if k.sandbox == req.SandboxID {
				n++
			}
		}
		if n >= maxExposuresPerSandbox {
			p.mu.Unlock()
			return nil, errdefs.LimitExceededf("port: sandbox %s has %d exposed ports already, the most allowed", req.SandboxID, n)
		}
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			p.mu.Unlock()
			return nil, errdefs.Wrap(errdefs.Internal, err, "preview token")
		}
		x = exposure{token: hex.EncodeToString(b[:]), created: time.Now().UTC()}
		if p.m == nil {
			p.m = map[portKey]exposure{}
		}
		p.m[key] = x
	}
	out := p.public(key, x)
	p.mu.Unlock()
	if fresh {
		if err := e.store.PutPortExposure(ctx, store.PortExposure{SandboxID: req.SandboxID, Port: req.Port, Token: x.token, CreatedAt: x.created}); err != nil {
			p.mu.Lock()
			delete(p.m, key)
			p.mu.Unlock()
			return nil, errdefs.Wrap(errdefs.Internal, err, "record the exposure")
		}
	}
	// The sandbox may have ended between the check and the insertion, after
	// its transition dropped its exposures: look again.
	if err := e.checkExposable(ctx, req.SandboxID); err != nil {
		e.endExposures(req.SandboxID)
		_ = e.store.DeletePortExposures(context.WithoutCancel(ctx), req.SandboxID, 0)
		return nil, err
	}
	return &out, nil
}

// checkExposable fails unless sandbox id exists and is live.
func (e *Engine) checkExposable(ctx context.Context, id string) error {
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return err
	}
	if !info.State.Live() {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, info.State)
	}
	if info.State == sandbox.StateCreating {
		return nil // its agent answers before it is ready; dialling waits
	}
	return e.sandboxes.Require(ctx, id, sandbox.CapPorts)
}

// Ports lists the sandbox's exposed ports, by port.
func (e *Engine) Ports(ctx context.Context, id string) ([]apitypes.PortExposure, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if _, err := e.sandboxes.Get(ctx, id); err != nil {
		return nil, err
	}
	e.ports.mu.Lock()
	defer e.ports.mu.Unlock()
	out := []apitypes.PortExposure{}
	for k, x := range e.ports.m {
		if k.sandbox == id {
			out = append(out, e.ports.public(k, x))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// UnexposePort ends an exposure; its token stops working at once
// (connections already open stay until they close).
func (e *Engine) UnexposePort(ctx context.Context, id string, port int) error {
	if err := checkSandboxID(id); err != nil {
		return err
	}
	if err := agent.ValidatePort(port); err != nil {
		return errdefs.Invalidf("port: %d is not in 1-65535", port)
	}
	if _, err := e.sandboxes.Get(ctx, id); err != nil {
		return err
	}
	e.ports.mu.Lock()
	key := portKey{id, port}
	_, ok := e.ports.m[key]
	delete(e.ports.m, key)
	e.ports.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("port: port %d of sandbox %s is not exposed", port, id)
	}
	if err := e.store.DeletePortExposures(ctx, id, port); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "forget the exposure")
	}
	return nil
}

// endExposures drops every exposure of sandbox id. It is called on every
// transition to a final state (under the sandbox's lock: it must not block).
func (e *Engine) endExposures(id string) {
	e.ports.mu.Lock()
	n := 0
	for k := range e.ports.m {
		if k.sandbox == id {
			delete(e.ports.m, k)
			n++
		}
	}
	e.ports.mu.Unlock()
	if n == 0 {
		return
	}
	// The rows go after the lock is released; one that a crash keeps is
	// removed at the next start (loadExposures).
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.store.DeletePortExposures(ctx, id, 0); err != nil {
			e.log.Warn("forget the exposures of an ended sandbox", "sandbox", id, "err", err)
		}
	}()
}

// loadExposures restores the exposures of live sandboxes after a restart
// and removes the rows of the others. It runs after reconciliation.
func (e *Engine) loadExposures(ctx context.Context) error {
	xs, err := e.store.ListPortExposures(ctx)
	if err != nil {
		return err
	}
	for _, x := range xs {
		info, err := e.sandboxes.Get(ctx, x.SandboxID)
		if err == nil && info.State.Live() {
			e.ports.mu.Lock()
			if e.ports.m == nil {
				e.ports.m = map[portKey]exposure{}
			}
			e.ports.m[portKey{x.SandboxID, x.Port}] = exposure{token: x.Token, created: x.CreatedAt}
			e.ports.mu.Unlock()
			continue
		}
		if err := e.store.DeletePortExposures(ctx, x.SandboxID, 0); err != nil {
			return err
		}
	}
	return nil
}

// AuthorizePreview checks a preview request's token against the exposure
// of the sandbox's port. An unknown exposure and a wrong token fail alike,
// so that the answer does not tell which sandboxes and ports exist.
func (e *Engine) AuthorizePreview(id string, port int, token string) error {
	e.ports.mu.Lock()
	x, ok := e.ports.m[portKey{id, port}]
	e.ports.mu.Unlock()
	if !ok || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(x.token)) != 1 {
		return errdefs.Unauthenticatedf("preview: a valid token for this port is required")
	}
	return nil
}

// DialExposed opens a connection to an exposed port of a sandbox through its
// agent. The caller has authorized the request (AuthorizePreview).
func (e *Engine) DialExposed(ctx context.Context, id string, port int) (net.Conn, error) {
	e.ports.mu.Lock()
	_, ok := e.ports.m[portKey{id, port}]
	e.ports.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("port: port %d of sandbox %s is not exposed", port, id)
	}
	return e.sandboxes.DialPort(ctx, id, port)
}

// endsExposures reports whether a transition to state to ends a sandbox's
// exposures.
func endsExposures(to sandbox.State) bool {
	return to == sandbox.StateTerminated || to == sandbox.StateFailed
}
