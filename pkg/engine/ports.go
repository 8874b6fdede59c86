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
	"strconv"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
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
// API). Exposures live in memory: they end with their sandbox (every
// transition to terminated or failed drops them, whatever caused it), on
// UnexposePort, and with the daemon process.

// ExposePortRequest asks for a sandbox's port to be served.
type ExposePortRequest = apitypes.ExposePortRequest

// PreviewPathPrefix is where the preview listener serves exposures.
const PreviewPathPrefix = "/preview/"

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
	m       map[portKey]*apitypes.PortExposure
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
		return nil, errdefs.Unavailablef("port: the daemon has no preview listener (server.preview_listen is empty)")
	}
	key := portKey{req.SandboxID, req.Port}
	x, ok := p.m[key]
	if !ok {
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
		tok := hex.EncodeToString(b[:])
		base := fmt.Sprintf("%s%s%s/%d/", p.baseURL, PreviewPathPrefix, req.SandboxID, req.Port)
		x = &apitypes.PortExposure{
			SandboxID: req.SandboxID, Port: req.Port,
			URL:     base + "?" + url.Values{apitypes.PreviewTokenParam: {tok}}.Encode(),
			BaseURL: base, Token: tok, TokenHeader: apitypes.PreviewTokenHeader,
			CreatedAt: time.Now().UTC(),
		}
		if p.m == nil {
			p.m = map[portKey]*apitypes.PortExposure{}
		}
		p.m[key] = x
	}
	out := *x
	p.mu.Unlock()
	// The sandbox may have ended between the check and the insertion, after
	// its transition dropped its exposures: look again.
	if err := e.checkExposable(ctx, req.SandboxID); err != nil {
		e.endExposures(req.SandboxID)
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
	return nil
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
			out = append(out, *x)
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
	defer e.ports.mu.Unlock()
	key := portKey{id, port}
	if _, ok := e.ports.m[key]; !ok {
		return errdefs.NotFoundf("port: port %d of sandbox %s is not exposed", port, id)
	}
	delete(e.ports.m, key)
	return nil
}

// endExposures drops every exposure of sandbox id. It is called on every
// transition to a final state (under the sandbox's lock: it must not block).
func (e *Engine) endExposures(id string) {
	e.ports.mu.Lock()
	defer e.ports.mu.Unlock()
	for k := range e.ports.m {
		if k.sandbox == id {
			delete(e.ports.m, k)
		}
	}
}

// AuthorizePreview checks a preview request's token against the exposure
// of the sandbox's port. An unknown exposure and a wrong token fail alike,
// so that the answer does not tell which sandboxes and ports exist.
func (e *Engine) AuthorizePreview(id string, port int, token string) error {
	e.ports.mu.Lock()
	x, ok := e.ports.m[portKey{id, port}]
	want := ""
	if ok {
		want = x.Token
	}
	e.ports.mu.Unlock()
	if !ok || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
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
		return nil, errdefs.NotFoundf("port: port %s of sandbox %s is not exposed", strconv.Itoa(port), id)
	}
	return e.sandboxes.DialPort(ctx, id, port)
}

// endsExposures reports whether a transition to state to ends a sandbox's
// exposures.
func endsExposures(to sandbox.State) bool {
	return to == sandbox.StateTerminated || to == sandbox.StateFailed
}
