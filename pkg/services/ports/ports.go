// Package ports is the preview-port service: the table of a sandbox's TCP
// ports exposed on the daemon's preview listener (pkg/preview), their tokens,
// and the dial through the sandbox's agent. It needs of the sandbox service
// only what its Sandboxes interface names, and of the state database only
// its Store, so it is tested and composed on its own (pkg/engine wires it).
package ports

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
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
// and on Unexpose.
//
// An exposure is also tied to the API key that made it: once that key is
// revoked or expired (SetKeyCheck), requests through the exposure are
// refused like a wrong token, and exposing the port again makes a new
// exposure (new token) for the new caller's key.

// Sandboxes is what the port service needs of the sandbox service.
type Sandboxes interface {
	Get(ctx context.Context, id string) (*sandbox.Info, error)
	Require(ctx context.Context, id string, want sandbox.Capability) error
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// Store keeps exposures across daemon restarts (the port_exposures table).
type Store interface {
	PutPortExposure(ctx context.Context, x store.PortExposure) error
	DeletePortExposures(ctx context.Context, sandboxID string, port int) error
	ListPortExposures(ctx context.Context) ([]store.PortExposure, error)
}

// Service is the table of exposed ports.
type Service struct {
	sandboxes Sandboxes
	store     Store
	log       *slog.Logger

	mu       sync.Mutex
	baseURL  string // the preview listener's address; "" until it listens
	m        map[portKey]exposure
	keyValid func(keyID string) bool // nil: every key is
}

// SetKeyCheck sets how the service learns whether the key an exposure was
// made with still authenticates (tenants.Service.Valid).
func (s *Service) SetKeyCheck(valid func(keyID string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keyValid = valid
}

// live says whether x's key still authenticates; under s.mu.
func (s *Service) live(x exposure) bool {
	return s.keyValid == nil || s.keyValid(x.keyID)
}

// New returns an empty table; Load restores the exposures a previous run
// of the daemon left.
func New(sandboxes Sandboxes, st Store, log *slog.Logger) *Service {
	return &Service{sandboxes: sandboxes, store: st, log: log}
}

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

type exposure struct {
	token   string
	created time.Time
	keyID   string // the key that made it ("" for the socket)
}

// public describes an exposure with the listener's current address (it may
// change across restarts: port 0).
func (s *Service) public(k portKey, x exposure) apitypes.PortExposure {
	base := fmt.Sprintf("%s%s%s/%d/", s.baseURL, PreviewPathPrefix, k.sandbox, k.port)
	query := "?" + url.Values{apitypes.PreviewTokenParam: {x.token}}.Encode()
	out := apitypes.PortExposure{
		SandboxID: k.sandbox, Port: k.port,
		URL: base + query, BaseURL: base, Token: x.token, TokenHeader: apitypes.PreviewTokenHeader,
		CreatedAt: x.created,
	}
	if u, err := url.Parse(s.baseURL); err == nil {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || ip != nil && ip.IsLoopback() {
			u.Host = net.JoinHostPort(fmt.Sprintf("p%d-%s%s", k.port, k.sandbox, PreviewHostSuffix), u.Port())
			out.HostURL = u.String() + "/" + query
		}
	}
	return out
}

// SetPreviewURL records the address browsers reach the preview listener at
// (http://host:port), once it listens; exposures before that are refused.
func (s *Service) SetPreviewURL(base string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.baseURL = base
}

// Expose serves the sandbox's port on the preview listener and returns
// the URL and token. Exposing an exposed port returns the existing
// exposure; nothing needs to listen on the port yet.
func (s *Service) Expose(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error) {
	if err := sandbox.CheckID(req.SandboxID); err != nil {
		return nil, err
	}
	if err := agent.ValidatePort(req.Port); err != nil {
		return nil, errdefs.Invalidf("port: %d is not in 1-65535", req.Port)
	}
	if err := s.checkExposable(ctx, req.SandboxID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.baseURL == "" {
		s.mu.Unlock()
		return nil, errdefs.Unavailablef("port: no preview listener (server.preview_listen is empty, or its address could not be opened)")
	}
	key := portKey{req.SandboxID, req.Port}
	x, ok := s.m[key]
	// An exposure whose key was revoked is dead: exposing again replaces
	// it (and its token) with one of the caller's key.
	fresh := !ok || !s.live(x)
	if fresh {
		n := 0
		for k := range s.m {
			if k.sandbox == req.SandboxID && k != key {
				n++
			}
		}
		if n >= maxExposuresPerSandbox {
			s.mu.Unlock()
			return nil, errdefs.LimitExceededf("port: sandbox %s has %d exposed ports already, the most allowed", req.SandboxID, n)
		}
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			s.mu.Unlock()
			return nil, errdefs.Wrap(errdefs.Internal, err, "preview token")
		}
		p, _ := principal.From(ctx)
		keyID := p.KeyID
		if principal.OriginFrom(ctx).FrontEnd == "gateway" && s.keyValid != nil && !s.keyValid(keyID) {
			// A fleet key a gateway authenticated, which this node does
			// not hold (its keys live in the fleet's store): tied to it,
			// the exposure would read as revoked at once. It is tied to
			// no key, as the unix socket's are; its token still gates it
			// and unexpose or terminate ends it.
			keyID = ""
		}
		x = exposure{token: hex.EncodeToString(b[:]), created: time.Now().UTC(), keyID: keyID}
		if s.m == nil {
			s.m = map[portKey]exposure{}
		}
		s.m[key] = x
	}
	out := s.public(key, x)
	s.mu.Unlock()
	if fresh {
		if err := s.store.PutPortExposure(ctx, store.PortExposure{SandboxID: req.SandboxID, Port: req.Port, Token: x.token, CreatedAt: x.created, KeyID: x.keyID}); err != nil {
			s.mu.Lock()
			delete(s.m, key)
			s.mu.Unlock()
			return nil, errdefs.Wrap(errdefs.Internal, err, "record the exposure")
		}
	}
	// The sandbox may have ended between the check and the insertion, after
	// its transition dropped its exposures: look again.
	if err := s.checkExposable(ctx, req.SandboxID); err != nil {
		s.End(req.SandboxID)
		_ = s.store.DeletePortExposures(context.WithoutCancel(ctx), req.SandboxID, 0)
		return nil, err
	}
	return &out, nil
}

// checkExposable fails unless sandbox id exists and is live.
func (s *Service) checkExposable(ctx context.Context, id string) error {
	info, err := s.sandboxes.Get(ctx, id)
	if err != nil {
		return err
	}
	if !info.State.Live() {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, info.State)
	}
	if info.State == sandbox.StateCreating {
		return nil // its agent answers before it is ready; dialling waits
	}
	return s.sandboxes.Require(ctx, id, sandbox.CapPorts)
}

// List lists the sandbox's exposed ports, by port.
func (s *Service) List(ctx context.Context, id string) ([]apitypes.PortExposure, error) {
	if err := sandbox.CheckID(id); err != nil {
		return nil, err
	}
	if _, err := s.sandboxes.Get(ctx, id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []apitypes.PortExposure{}
	for k, x := range s.m {
		if k.sandbox == id {
			out = append(out, s.public(k, x))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// Unexpose ends an exposure; its token stops working at once
// (connections already open stay until they close).
func (s *Service) Unexpose(ctx context.Context, id string, port int) error {
	if err := sandbox.CheckID(id); err != nil {
		return err
	}
	if err := agent.ValidatePort(port); err != nil {
		return errdefs.Invalidf("port: %d is not in 1-65535", port)
	}
	if _, err := s.sandboxes.Get(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	key := portKey{id, port}
	_, ok := s.m[key]
	delete(s.m, key)
	s.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("port: port %d of sandbox %s is not exposed", port, id)
	}
	if err := s.store.DeletePortExposures(ctx, id, port); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "forget the exposure")
	}
	return nil
}

// End drops every exposure of sandbox id. It is called on every
// transition to a final state (under the sandbox's lock: it must not block).
func (s *Service) End(id string) {
	s.mu.Lock()
	n := 0
	for k := range s.m {
		if k.sandbox == id {
			delete(s.m, k)
			n++
		}
	}
	s.mu.Unlock()
	if n == 0 {
		return
	}
	// The rows go after the lock is released; one that a crash keeps is
	// removed at the next start (Load).
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.store.DeletePortExposures(ctx, id, 0); err != nil {
			s.log.Warn("forget the exposures of an ended sandbox", "sandbox", id, "err", err)
		}
	}()
}

// Load restores the exposures of live sandboxes after a restart
// and removes the rows of the others. It runs after reconciliation.
func (s *Service) Load(ctx context.Context) error {
	xs, err := s.store.ListPortExposures(ctx)
	if err != nil {
		return err
	}
	for _, x := range xs {
		info, err := s.sandboxes.Get(ctx, x.SandboxID)
		if err == nil && info.State.Live() {
			s.mu.Lock()
			if s.m == nil {
				s.m = map[portKey]exposure{}
			}
			s.m[portKey{x.SandboxID, x.Port}] = exposure{token: x.Token, created: x.CreatedAt, keyID: x.KeyID}
			s.mu.Unlock()
			continue
		}
		if err := s.store.DeletePortExposures(ctx, x.SandboxID, 0); err != nil {
			return err
		}
	}
	return nil
}

// Authorize checks a preview request's token against the exposure
// of the sandbox's port. An unknown exposure and a wrong token fail alike,
// so that the answer does not tell which sandboxes and ports exist.
func (s *Service) Authorize(id string, port int, token string) error {
	s.mu.Lock()
	x, ok := s.m[portKey{id, port}]
	ok = ok && s.live(x) // the key that made it still authenticates
	s.mu.Unlock()
	if !ok || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(x.token)) != 1 {
		return errdefs.Unauthenticatedf("preview: a valid token for this port is required")
	}
	return nil
}

// Dial opens a connection to an exposed port of a sandbox through its
// agent. The caller has authorized the request (Authorize).
func (s *Service) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	s.mu.Lock()
	_, ok := s.m[portKey{id, port}]
	s.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("port: port %d of sandbox %s is not exposed", port, id)
	}
	return s.sandboxes.DialPort(ctx, id, port)
}

// Ends reports whether a transition to state to ends a sandbox's
// exposures.
func Ends(to sandbox.State) bool {
	return to == sandbox.StateTerminated || to == sandbox.StateFailed
}
