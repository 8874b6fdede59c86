// Package sandbox owns the lifecycle of sandboxes: creation from an image,
// the state machine (creating → ready ⇄ running → terminated, and failed),
// commands and files through each sandbox's agent, limits enforcement by the
// reaper, and the removal of every trace on termination.
//
// Every state change is checked against the transition table, persisted in
// SQLite with an event row (pkg/store), and only then visible to callers. The
// Manager is safe for concurrent use; each sandbox has its own lock, so slow
// work on one sandbox never blocks another.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	rtrace "runtime/trace"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Limits are a sandbox's resource limits, already validated and capped.
type Limits = apitypes.Limits

// Spec is what a sandbox is created from. It is persisted as JSON.
type Spec struct {
	Language string `json:"language"`
	Image    string `json:"image"`
	// ImageDigest pins the sandbox to that stored build of Image (a run
	// replayed on the image it first ran on) instead of the current one.
	ImageDigest string `json:"image_digest,omitempty"`
	Limits      Limits `json:"limits"`
	// DiskBacking is storage.BackingDisk or storage.BackingMemory; empty
	// in specs persisted before it existed (their file systems are
	// released through the ledger like any other).
	DiskBacking string `json:"disk_backing,omitempty"`
	Network     string `json:"network"`
	// Allow is the allowlist of network mode allowlist (host names,
	// *.domain, CIDRs, @preset).
	Allow []string `json:"allow,omitempty"`
	// Credentials are granted through the network's credential proxy.
	Credentials []string          `json:"credentials,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	// NetEnv is the environment the network gave the sandbox when it was
	// attached (credential proxy URLs, dummy keys); it wins over Env so
	// that the proxy is what clients use. Not shown to clients (the URLs
	// carry the per-sandbox token).
	NetEnv map[string]string `json:"net_env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	TTL    time.Duration     `json:"ttl,omitempty"` // 0: the configured max lifetime
	// PauseOnExpiry pauses the sandbox when its TTL passes instead of
	// terminating it (the E2B front end's autoPause); it is terminated
	// when the configured max lifetime passes.
	PauseOnExpiry bool `json:"pause_on_expiry,omitempty"`
	UID           int  `json:"uid"`
	// Root: UID is 0, inside the sandbox's own user namespace.
	Root bool `json:"root,omitempty"`
	// SeccompProfile is the profile name; empty: the backend's default.
	SeccompProfile string `json:"seccomp_profile,omitempty"`
	// ImageEnv is the image's environment, kept so that a restarted daemon
	// runs commands exactly as before even if the image was rebuilt since.
	ImageEnv map[string]string `json:"image_env,omitempty"`
	// WorkDir is where commands run when they name no directory: an OCI
	// image's WorkingDir; empty: /workspace.
	WorkDir string `json:"workdir,omitempty"`
	// Backend names the backend that runs the sandbox ("container", "vm");
	// empty means Options.Backend.
	Backend string `json:"backend,omitempty"`
	// Seed is the host path of a workspace snapshot archive
	// (pkg/storage/snapshot.go) the backend lays over the new sandbox's
	// writable state before it starts (a fork); SeedSnapshot is its id.
	Seed         string `json:"seed,omitempty"`
	SeedSnapshot string `json:"seed_snapshot,omitempty"`
	// BootDisk is set for a VM that boots an administrator's disk image
	// (vm.images.<os>) instead of an image of the store: its path, which
	// Image repeats for clients; Language then is the guest's OS. Such a
	// sandbox is not made from the image store (StartRequest.Image is nil).
	BootDisk string `json:"boot_disk,omitempty"`
	// Tenant owns the sandbox and KeyID is the API key that created it
	// (its quota counts the sandbox): both from the creating request's
	// principal, never from a client's request body ("" for the unix
	// socket, the warm pool and records made before tenants).
	Tenant string `json:"tenant,omitempty"`
	KeyID  string `json:"key_id,omitempty"`
	// Volumes are the named volumes the backend mounts into the sandbox.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Template names the template the sandbox was made from (the engine's
	// templates); its warm pool is keyed "template:" + Template.
	Template string `json:"template,omitempty"`
}

// VolumeMount is a named volume mounted into a sandbox, with the host
// path of the volume's file system (pkg/services/volumes keeps it mounted
// there while the volume exists).
type VolumeMount struct {
	apitypes.VolumeMount
	Source string `json:"source"`
}

// VolumeUsers lists the live sandboxes that mount the volume the daemon
// mounts at source (its mount path: volume names are per tenant, the
// path is one volume's).
func (m *Manager) VolumeUsers(source string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id, sb := range m.sandboxes {
		sb.mu.Lock()
		for _, v := range sb.spec.Volumes {
			if v.Source == source {
				out = append(out, id)
				break
			}
		}
		sb.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Info is the externally visible description of a sandbox.
type Info = apitypes.Sandbox

// Options configure a Manager.
type Options struct {
	Store  *store.Store
	Images *image.Store
	// Backend starts the machines sandboxes run in; Ledger records what
	// each sandbox holds and releases it (the backend registered its kinds).
	// Backends are further backends a Spec may name (the VM backend).
	Backend  Backend
	Backends []Backend
	Ledger   *ledger.Ledger
	// Network attaches sandboxes with a network mode other than "none";
	// nil: only "none" can start.
	Network      Network
	MaxSandboxes int
	// NodeName (config node.name), non-empty, is written into every new
	// id as NodeTag(NodeName): a gateway routes by id without a lookup.
	NodeName    string
	IdleTimeout time.Duration // 0: never
	MaxLifetime time.Duration // 0: never
	OutputLimit int64         // per stream per command
	// Pool is the number of warm sandboxes to keep per image, started from
	// PoolSpec(image), the spec a default request for it gets.
	Pool map[string]int
	// PoolReady, when set, makes a warm sandbox of key ready before it is
	// offered (a template's start command and readiness check); an error
	// ends that sandbox.
	PoolReady    func(ctx context.Context, id, key string) error
	PoolSpec     func(image string) (Spec, error)
	ReapInterval time.Duration // how often the reaper looks; default 1s
	AgentStartup time.Duration // how long the agent may take to answer; default 15s
	Log          *slog.Logger
	Now          func() time.Time
	// OnTransition, if set, is called after every persisted transition
	// (metrics). It runs under the sandbox's lock and must not block.
	OnTransition func(id string, from, to State, reason string)
	// Admit, if set, admits a create of a sandbox of limits for ctx's
	// caller (its key's quota) before anything is started; release is
	// called once the create has ended.
	Admit func(ctx context.Context, limits Limits) (release func(), err error)
}

// Manager creates, tracks and destroys sandboxes.
type Manager struct {
	opt Options
	log *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*Sandbox // live sandboxes (creating, ready, running)
	creating  int                 // reservations against MaxSandboxes
	// forgotten is closed (and replaced) whenever a sandbox leaves
	// sandboxes: a create at max_sandboxes waits on it for the ones
	// being terminated (see admitLocked).
	forgotten chan struct{}

	events bus
	// lifecycle receives the lifecycle events (lifecycle.go).
	lifecycle atomic.Pointer[lifecycleSink]

	stopReaper context.CancelFunc
	reaperDone chan struct{}
	poolDone   chan struct{}
	poolPoke   chan struct{}
	// poolSizes are warm pool sizes set at run time (SetPool: templates),
	// beside Options.Pool; guarded by mu.
	poolSizes map[string]int
	// refillHold: a pool key's refill waits until then (a claim's
	// request is running; see claim); guarded by mu.
	refillHold map[string]time.Time
	closed     chan struct{} // closed by Close
	closeOnce  sync.Once

	trim memTrim // returns ended sandboxes' memory after a burst
}

// Sandbox is one live sandbox.
type Sandbox struct {
	ID   string
	spec Spec

	mu          sync.Mutex
	state       State
	createdAt   time.Time
	lastActive  time.Time
	running     int // commands in flight
	terminating bool
	digest      string
	handle      Handle // nil until the backend started it
	agent       *agent.Client
	jobs        map[string]jobMeta
	pooled      bool // a warm sandbox no request has claimed yet
	// fromPool: a request claimed this sandbox from the warm pool; its
	// end pokes the pool (see claim).
	fromPool atomic.Bool
	// busy is busySnapshot or busyRestore while Frozen or Replace run
	// (snapshot.go); empty otherwise.
	busy string
	// caps is the handle's Capabilities().List(), set with the handle:
	// descriptions read it without sb.mu (they are made under it).
	caps atomic.Pointer[[]string]
	// tenant is spec.Tenant, readable without mu (ownership checks and
	// events run under other locks).
	tenant atomic.Pointer[string]
}

// setCaps records h's capabilities for descriptions.
func (sb *Sandbox) setCaps(h Handle) {
	l := h.Capabilities().List()
	sb.caps.Store(&l)
}

// NewManager returns a Manager. Call Start to run the reaper.
func NewManager(opt Options) (*Manager, error) {
	if opt.Store == nil || opt.Images == nil || opt.Backend == nil || opt.Ledger == nil {
		return nil, errors.New("sandbox: store, images, backend and ledger are required")
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.ReapInterval <= 0 {
		opt.ReapInterval = time.Second
	}
	if opt.AgentStartup <= 0 {
		opt.AgentStartup = 15 * time.Second
	}
	return &Manager{opt: opt, log: opt.Log, sandboxes: map[string]*Sandbox{}, poolPoke: make(chan struct{}, 1), closed: make(chan struct{})}, nil
}

// backend returns the backend called name ("" is the default one).
func (m *Manager) backend(name string) (Backend, error) {
	if name == "" || name == m.opt.Backend.Name() {
		return m.opt.Backend, nil
	}
	names := []string{m.opt.Backend.Name()}
	for _, b := range m.opt.Backends {
		if b.Name() == name {
			return b, nil
		}
		names = append(names, b.Name())
	}
	return nil, errdefs.Invalidf("backend: %q is not one of %s", name, strings.Join(names, ", "))
}

// allBackends is the default backend followed by the others.
func (m *Manager) allBackends() []Backend {
	return append([]Backend{m.opt.Backend}, m.opt.Backends...)
}

// AgentStarter is implemented by backends whose agent may need longer than
// Options.AgentStartup to answer (a VM booting under TCG).
type AgentStarter interface {
	AgentStartup() time.Duration
}

// Start runs the background work until Close: the reaper that enforces idle
// timeouts and lifetimes, and the warm pool's filler.
func (m *Manager) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	m.stopReaper = cancel
	m.reaperDone, m.poolDone = make(chan struct{}), make(chan struct{})
	go m.reap(ctx)
	go m.fillPool(ctx)
}

// Close stops the background work. Sandboxes keep running: they outlive the
// daemon, warm ones included.
func (m *Manager) Close() {
	// The watchers of sandboxes' inits stop too: a sandbox that ends
	// after this is found by the next daemon's reconciliation, not
	// recorded through a store this one is closing.
	m.closeOnce.Do(func() { close(m.closed) })
	m.trim.stop()
	if m.stopReaper != nil {
		m.stopReaper()
		<-m.reaperDone
		<-m.poolDone
		m.stopReaper = nil
	}
}

func newID(node string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	if node != "" {
		return "sb-" + NodeTag(node) + hex.EncodeToString(b[:])
	}
	return "sb-" + hex.EncodeToString(b[:])
}

// Create returns a ready sandbox for spec: a warm one from the pool when one
// fits, else a new one, started before Create returns (or failed).
func (m *Manager) Create(ctx context.Context, spec Spec) (*Info, error) {
	// The one place a sandbox gets its owner: every front end and every
	// engine path (run_code, autofix, agents, VMs) creates through here.
	spec.Tenant, spec.KeyID = "", ""
	if p, ok := principal.From(ctx); ok {
		spec.Tenant, spec.KeyID = p.Tenant, p.KeyID
	}
	if m.opt.Admit != nil {
		release, err := m.opt.Admit(ctx, spec.Limits)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	if info, err := m.claim(ctx, spec); err != nil || info != nil {
		return info, err
	}
	return m.create(ctx, spec)
}

// create starts a new sandbox.
func (m *Manager) create(ctx context.Context, spec Spec) (*Info, error) {
	// Regions of the Go execution tracer: the create path's breakdown in
	// docs/ARCHITECTURE.md is read from them (free when no trace runs).
	defer rtrace.StartRegion(ctx, "sandbox.create").End()
	if _, err := m.backend(spec.Backend); err != nil {
		return nil, err
	}
	img := &image.Image{} // a boot disk is no image of the store
	if spec.BootDisk == "" {
		var err error
		if spec.ImageDigest != "" {
			img, err = m.opt.Images.GetDigest(spec.Image, spec.ImageDigest)
			if errors.Is(err, image.ErrNotFound) {
				return nil, errdefs.FailedPreconditionf("image %q digest %s is no longer stored (rebuilt and pruned since)", spec.Image, spec.ImageDigest)
			}
		} else {
			img, err = m.opt.Images.Get(spec.Image)
		}
		if errors.Is(err, image.ErrNotFound) {
			return nil, errdefs.Unavailablef("image %q is not built (sandboxctl images build %s)", spec.Image, spec.Image)
		}
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "look up image %q", spec.Image)
		}
	}

	m.mu.Lock()
	if !m.admitLocked(ctx) {
		m.mu.Unlock()
		return nil, errdefs.LimitExceededf("max_sandboxes (%d) live sandboxes already exist", m.opt.MaxSandboxes)
	}
	m.creating++
	reserved := true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if reserved {
			m.creating--
		}
		m.mu.Unlock()
	}()

	spec.ImageEnv = img.Env
	now := m.opt.Now().UTC()
	sb := &Sandbox{
		ID: newID(m.opt.NodeName), spec: spec, state: StateCreating, createdAt: now, lastActive: now, digest: img.Digest,
	}
	sb.setTenant(spec.Tenant)
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "encode sandbox spec")
	}
	rec := &store.SandboxRecord{
		ID: sb.ID, State: string(StateCreating), Language: spec.Language, Image: spec.Image,
		ImageDigest: img.Digest, Spec: specJSON,
		CreatedAt: now, UpdatedAt: now, LastActiveAt: now,
	}
	reg := rtrace.StartRegion(ctx, "sandbox.insert")
	err = m.opt.Store.InsertSandbox(ctx, rec)
	reg.End()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "record sandbox")
	}
	crashpoint.Hit(CrashAfterRecord)
	m.announceSandbox(sb, apitypes.EventSandboxCreated, "")
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.creating-- // the sandbox itself now counts against max_sandboxes
	reserved = false
	m.mu.Unlock()

	if err := m.boot(ctx, sb, img); err != nil {
		m.log.Warn("sandbox failed to start", "sandbox", sb.ID, "err", err)
		m.teardown(ctx, sb)
		m.forget(sb.ID)
		if terr := m.transition(context.WithoutCancel(ctx), sb, StateFailed, err.Error()); terr != nil {
			m.log.Error("record failed sandbox", "sandbox", sb.ID, "err", terr)
		}
		if errdefs.CodeOf(err) == errdefs.Internal {
			return nil, errdefs.Wrap(errdefs.Internal, err, "sandbox %s failed to start", sb.ID)
		}
		return nil, err
	}
	m.watchInit(sb)
	m.trim.note()
	return m.Get(ctx, sb.ID)
}

// boot has the backend start the sandbox and waits for its agent.
func (m *Manager) boot(ctx context.Context, sb *Sandbox, img *image.Image) error {
	req := StartRequest{ID: sb.ID, Spec: sb.spec, Image: img}
	if sb.spec.BootDisk != "" {
		req.Image = nil
	}
	if sb.spec.Network != "" && sb.spec.Network != "none" {
		if m.opt.Network == nil {
			return errdefs.Unavailablef("network: mode %q needs the network subsystem, which is not configured", sb.spec.Network)
		}
		a, err := m.opt.Network.Attach(ctx, sb.ID, sb.spec, m.opt.Ledger.For(sb.ID))
		if err != nil {
			return err
		}
		req.NetNSPath, req.ResolvConf = a.NetNSPath, a.ResolvConf
		if len(a.Env) > 0 {
			sb.mu.Lock()
			sb.spec.NetEnv = a.Env
			specJSON, err := json.Marshal(sb.spec)
			sb.mu.Unlock()
			if err != nil {
				return err
			}
			if err := m.opt.Store.UpdateSandbox(ctx, sb.ID, func(r *store.SandboxRecord) { r.Spec = specJSON }); err != nil {
				return err
			}
		}
	}
	b, err := m.backend(sb.spec.Backend)
	if err != nil {
		return err
	}
	reg := rtrace.StartRegion(ctx, "sandbox.backend-start")
	h, err := b.Start(ctx, req, m.opt.Ledger.For(sb.ID))
	reg.End()
	if err != nil {
		return err
	}
	client := agentClient(h)
	sb.mu.Lock()
	sb.handle, sb.agent = h, client
	sb.setCaps(h)
	sb.mu.Unlock()
	if al, ok := h.(Agentless); ok {
		if err := al.WaitReady(ctx); err != nil {
			return err
		}
	} else {
		limit := m.opt.AgentStartup
		if as, ok := b.(AgentStarter); ok && as.AgentStartup() > limit {
			limit = as.AgentStartup()
		}
		reg := rtrace.StartRegion(ctx, "sandbox.wait-agent")
		err := waitAgent(ctx, client, h, limit)
		reg.End()
		if err != nil {
			return err
		}
	}
	crashpoint.Hit(CrashAfterAgent)
	id := h.Identity()
	reg = rtrace.StartRegion(ctx, "sandbox.ready-transition")
	err = m.transition(ctx, sb, StateReady, "agent ready", func(r *store.SandboxRecord) {
		r.InitPID, r.InitStartTime, r.CgroupPath = id.PID, id.StartTime, h.CgroupPath()
	})
	reg.End()
	crashpoint.Hit(CrashAfterReady)
	return err
}

// agentClient is the agent client of h. A handle without our agent gets
// one whose every call fails at once with the handle's reason (the
// capability checks, Sandbox.require, come first; this keeps a path that
// misses them from dialling).
func agentClient(h Handle) *agent.Client {
	if !h.Capabilities().Agent {
		return agent.NewClient(func(context.Context) (net.Conn, error) {
			why := "no sandbox agent runs in it"
			if al, ok := h.(Agentless); ok {
				why = al.NoAgent()
			}
			return nil, errdefs.Unavailablef("%s", why)
		})
	}
	return agent.NewClient(h.Dial)
}

// Crash points (internal/crashpoint) of a sandbox's start, around the
// backend's own.
const (
	CrashAfterRecord = "sandbox.recorded" // the row exists, nothing acquired
	CrashAfterAgent  = "sandbox.agent"    // the agent answered, state still creating
	CrashAfterReady  = "sandbox.ready"    // ready: a restart adopts it
)

// waitAgent pings the agent until it answers, within limit. Each ping may
// take longer than the last (1 s doubling up to 16 s): on a saturated host
// an agent that is up can take seconds to answer (a VM's goes through the
// guest's virtio-serial port), and a ping cut short every time would
// never see it.
func waitAgent(ctx context.Context, c *agent.Client, h Handle, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	delay, attempt := 2*time.Millisecond, time.Second
	for {
		pctx, pcancel := context.WithTimeout(ctx, attempt)
		_, err := c.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		attempt = min(2*attempt, 16*time.Second)
		select {
		case <-h.Done():
			return fmt.Errorf("sandbox init exited during start (%s)", h.ExitDescription())
		case <-ctx.Done():
			return fmt.Errorf("agent did not answer within %s: %w", limit, err)
		case <-time.After(delay):
		}
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// transition moves sb to state `to`, checked against the table and persisted
// with an event, under sb.mu.
func (m *Manager) transition(ctx context.Context, sb *Sandbox, to State, reason string, mutate ...func(*store.SandboxRecord)) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return m.transitionLocked(ctx, sb, to, reason, mutate...)
}

func (m *Manager) transitionLocked(ctx context.Context, sb *Sandbox, to State, reason string, mutate ...func(*store.SandboxRecord)) error {
	from := sb.state
	if !CanTransition(from, to) {
		err := &ErrIllegalTransition{From: from, To: to}
		m.log.Error("refused sandbox transition", "sandbox", sb.ID, "from", from, "to", to, "reason", reason)
		return errdefs.Wrap(errdefs.Internal, err, "sandbox %s cannot go from %s to %s", sb.ID, from, to)
	}
	err := m.opt.Store.Transition(ctx, sb.ID, string(from), string(to), reason, func(r *store.SandboxRecord) {
		if to == StateTerminated || to == StateFailed {
			r.TerminationReason = reason
		}
		for _, f := range mutate {
			f(r)
		}
	})
	return m.transitioned(sb, from, to, reason, err)
}

// commandTransitionLocked is transitionLocked for a command's start and
// end (ready <-> running), which change nothing but the state and, when
// lastActive is not zero, the last activity: the store's one-statement
// TransitionActive, with the same checks, event and order.
func (m *Manager) commandTransitionLocked(ctx context.Context, sb *Sandbox, to State, reason string, lastActive time.Time) error {
	from := sb.state
	if !CanTransition(from, to) {
		err := &ErrIllegalTransition{From: from, To: to}
		m.log.Error("refused sandbox transition", "sandbox", sb.ID, "from", from, "to", to, "reason", reason)
		return errdefs.Wrap(errdefs.Internal, err, "sandbox %s cannot go from %s to %s", sb.ID, from, to)
	}
	err := m.opt.Store.TransitionActive(ctx, sb.ID, string(from), string(to), reason, lastActive)
	return m.transitioned(sb, from, to, reason, err)
}

// transitioned finishes a transition the store has persisted (err nil):
// the sandbox's state in memory, the event bus, OnTransition.
func (m *Manager) transitioned(sb *Sandbox, from, to State, reason string, err error) error {
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "persist sandbox %s transition %s -> %s", sb.ID, from, to)
	}
	sb.state = to
	m.log.Debug("sandbox transition", "sandbox", sb.ID, "from", from, "to", to, "reason", reason)
	m.events.publish(Event{Type: "state", SandboxID: sb.ID, Tenant: sb.owner(), From: string(from), To: string(to), Reason: reason})
	m.announceTransition(sb, from, to, reason)
	if m.opt.OnTransition != nil {
		m.opt.OnTransition(sb.ID, from, to, reason)
	}
	return nil
}

// watchInit terminates the sandbox when its init (the agent) dies on its own.
func (m *Manager) watchInit(sb *Sandbox) {
	sb.mu.Lock()
	h := sb.handle
	sb.mu.Unlock()
	if h == nil {
		return
	}
	if en, ok := h.(ExitNotifier); ok {
		en.OnExit(func() { m.initExited(sb, h) })
		return
	}
	go func() {
		select {
		case <-h.Done():
		case <-m.closed:
			return
		}
		m.initExited(sb, h)
	}()
}

// initExited ends sb, whose init (h's main process) has exited, unless it
// is being terminated already or the manager is closing.
func (m *Manager) initExited(sb *Sandbox, h Handle) {
	select {
	case <-m.closed:
		return
	default:
	}
	sb.mu.Lock()
	terminating := sb.terminating
	sb.mu.Unlock()
	if terminating {
		return
	}
	reason := "sandbox init exited"
	if d := h.ExitDescription(); d != "" {
		reason += " (" + d + ")"
	}
	if n, err := h.OOMKills(); err == nil && n > 0 {
		reason += "; the OOM killer fired in the sandbox"
	}
	// Its init is gone: there is nothing left to keep, so release first
	// and record after (a failed write is settled by reconcile at the next
	// start, which finds no init behind the record).
	if _, err := m.terminate(context.Background(), sb.ID, reason, false); err != nil && !errdefs.Is(err, errdefs.NotFound) {
		m.log.Error("terminate sandbox after init exit", "sandbox", sb.ID, "err", err)
	}
}

// lookup returns the live sandbox id, or a not_found / conflict error that
// names what is wrong.
func (m *Manager) lookup(ctx context.Context, id string) (*Sandbox, error) {
	m.mu.Lock()
	sb := m.sandboxes[id]
	m.mu.Unlock()
	if sb != nil {
		if !visible(ctx, sb.owner()) {
			return nil, errNoSandbox(id)
		}
		return sb, nil
	}
	rec, err := m.opt.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !visible(ctx, recordTenant(rec))) {
		return nil, errNoSandbox(id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up sandbox %s", id)
	}
	return nil, errdefs.Conflictf("sandbox %s is %s", id, rec.State)
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	sb, was := m.sandboxes[id]
	delete(m.sandboxes, id)
	if m.forgotten != nil {
		close(m.forgotten)
		m.forgotten = nil
	}
	m.mu.Unlock()
	if was {
		m.trim.note()
	}
	if sb != nil && sb.fromPool.Load() {
		// Its slot is free and its request answered: refill now (see claim).
		m.mu.Lock()
		delete(m.refillHold, poolKey(sb.spec))
		m.mu.Unlock()
		m.pokePool()
	}
}

// terminatingWait bounds how long a create at max_sandboxes waits for the
// sandboxes being terminated to go.
const terminatingWait = 10 * time.Second

// admitLocked reports whether one more sandbox fits under max_sandboxes.
// Sandboxes being terminated still count until they are gone; a create
// that only they keep out waits for them (up to terminatingWait), since
// their callers have their answer already — run_code terminates its
// ephemeral sandbox after answering — and a client's next create must not
// be refused for a sandbox it has seen end. m.mu is held, and released
// while waiting.
func (m *Manager) admitLocked(ctx context.Context) bool {
	if m.opt.MaxSandboxes <= 0 {
		return true
	}
	var deadline <-chan time.Time
	for len(m.sandboxes)+m.creating >= m.opt.MaxSandboxes {
		ending := 0
		for _, sb := range m.sandboxes {
			sb.mu.Lock()
			if sb.terminating {
				ending++
			}
			sb.mu.Unlock()
		}
		if len(m.sandboxes)+m.creating-ending >= m.opt.MaxSandboxes {
			return false
		}
		if deadline == nil {
			t := time.NewTimer(terminatingWait)
			defer t.Stop()
			deadline = t.C
		}
		if m.forgotten == nil {
			m.forgotten = make(chan struct{})
		}
		gone := m.forgotten
		m.mu.Unlock()
		var ok bool
		select {
		case <-gone:
			ok = true
		case <-ctx.Done():
		case <-deadline:
		}
		m.mu.Lock()
		if !ok {
			return len(m.sandboxes)+m.creating < m.opt.MaxSandboxes
		}
	}
	return true
}

// Get describes sandbox id, live or not.
func (m *Manager) Get(ctx context.Context, id string) (*Info, error) {
	rec, err := m.opt.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !visible(ctx, recordTenant(rec))) {
		return nil, errNoSandbox(id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up sandbox %s", id)
	}
	return m.info(rec), nil
}

// List describes the sandboxes in the given states (all live ones when
// states is empty; terminated and failed ones only when asked for).
func (m *Manager) List(ctx context.Context, states ...State) ([]*Info, error) {
	f := store.ListFilter{}
	for _, s := range states {
		f.States = append(f.States, string(s))
		if !s.Live() {
			f.IncludeTerminated = true
		}
	}
	if len(states) == 0 {
		f.States = []string{string(StateCreating), string(StateReady), string(StateRunning), string(StatePaused)}
	}
	recs, err := m.opt.Store.ListSandboxes(ctx, f)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list sandboxes")
	}
	out := make([]*Info, 0, len(recs))
	for _, r := range recs {
		if in := m.info(r); visible(ctx, in.Tenant) {
			out = append(out, in)
		}
	}
	return out, nil
}

func (m *Manager) info(r *store.SandboxRecord) *Info {
	var spec Spec
	_ = json.Unmarshal(r.Spec, &spec) // written by us; a decode error leaves zero limits
	in := &Info{
		ID: r.ID, State: State(r.State), Language: r.Language, Image: r.Image, ImageDigest: r.ImageDigest,
		Limits: spec.Limits, DiskBacking: spec.DiskBacking, Network: spec.Network, Allow: spec.Allow, Credentials: spec.Credentials, SeccompProfile: spec.SeccompProfile, Env: spec.Env, Labels: spec.Labels, CgroupPath: r.CgroupPath,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, LastActiveAt: r.LastActiveAt,
		TerminatedAt: r.TerminatedAt, Reason: r.TerminationReason, Backend: spec.Backend,
		FromSnapshot: spec.SeedSnapshot, Tenant: spec.Tenant, Template: spec.Template,
	}
	for _, v := range spec.Volumes {
		in.Volumes = append(in.Volumes, v.VolumeMount)

	}
	if in.State.Live() {
		m.mu.Lock()
		sb := m.sandboxes[r.ID]
		m.mu.Unlock()
		if sb != nil {
			if l := sb.caps.Load(); l != nil {
				in.Capabilities = *l
			}
		}
	}
	if life := m.lifetime(spec); life > 0 && in.State.Live() {
		exp := r.CreatedAt.Add(life)
		in.ExpiresAt = &exp
	}
	return in
}

func (m *Manager) lifetime(spec Spec) time.Duration {
	if spec.TTL > 0 && (m.opt.MaxLifetime == 0 || spec.TTL < m.opt.MaxLifetime) {
		return spec.TTL
	}
	return m.opt.MaxLifetime
}

// Terminate stops sandbox id and removes every trace of it: processes,
// cgroups, mounts, state directories. Terminating a terminated sandbox is a
// no-op that returns its description.
func (m *Manager) Terminate(ctx context.Context, id, reason string) (*Info, error) {
	return m.terminate(ctx, id, reason, true)
}

// terminate ends sandbox id. recordFirst writes the terminated state
// before releasing anything (a sandbox that still runs); without it the
// release comes first (a sandbox whose init is gone).
func (m *Manager) terminate(ctx context.Context, id, reason string, recordFirst bool) (*Info, error) {
	defer rtrace.StartRegion(ctx, "sandbox.terminate").End()
	m.mu.Lock()
	sb := m.sandboxes[id]
	m.mu.Unlock()
	if sb == nil {
		return m.Get(ctx, id) // not live: already terminated or failed, or not_found
	}
	if !visible(ctx, sb.owner()) {
		return nil, errNoSandbox(id)
	}
	sb.mu.Lock()
	if sb.terminating {
		sb.mu.Unlock()
		return m.waitGone(ctx, id)
	}
	sb.terminating = true
	sb.mu.Unlock()

	if reason == "" {
		reason = "terminated by request"
	}
	// The record says terminated before anything is released. If that
	// write fails, nothing is torn down: the sandbox stays as its record
	// says (live, usable, and the caller may retry), never a record saying
	// ready with nothing behind it. A crash between the write and the
	// release leaves ledger entries of a terminated sandbox, which
	// reconcile and gc release.
	if !recordFirst {
		m.teardown(ctx, sb)
		m.forget(id)
	}
	reg := rtrace.StartRegion(ctx, "sandbox.terminated-transition")
	err := m.transition(context.WithoutCancel(ctx), sb, StateTerminated, reason)
	reg.End()
	TerminateRecorded(ctx)
	if err != nil {
		if recordFirst {
			sb.mu.Lock()
			sb.terminating = false
			sb.mu.Unlock()
		}
		return nil, err
	}
	if recordFirst {
		m.teardown(ctx, sb)
		m.forget(id)
	}
	return m.Get(ctx, id)
}

type recordedKey struct{}

// OnTerminateRecorded returns ctx for a Terminate that calls f once the
// terminated state is written (or failed to be), before the release: a
// caller that lets the release finish in the background (run_code's
// ephemeral sandbox) waits for this much, so that nobody lists the
// sandbox live after it has answered.
func OnTerminateRecorded(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, recordedKey{}, f)
}

// TerminateRecorded calls ctx's OnTerminateRecorded function, if any: a
// terminate has written the terminated state (or failed to). Terminate
// calls it; so do stand-ins for the manager in tests.
func TerminateRecorded(ctx context.Context) {
	if f, _ := ctx.Value(recordedKey{}).(func()); f != nil {
		f()
	}
}

func (m *Manager) waitGone(ctx context.Context, id string) (*Info, error) {
	for {
		m.mu.Lock()
		_, live := m.sandboxes[id]
		m.mu.Unlock()
		if !live {
			return m.Get(ctx, id)
		}
		select {
		case <-ctx.Done():
			return nil, errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "sandbox %s is still terminating", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// teardown releases everything the sandbox holds by walking its ledger:
// the backend's process (which kills the sandbox), cgroups, mounts, dirs.
// Errors are logged, not returned: every release runs regardless, and what
// fails stays in the ledger for garbage collection to retry.
func (m *Manager) teardown(ctx context.Context, sb *Sandbox) {
	sb.mu.Lock()
	sb.terminating = true
	sb.mu.Unlock()
	if _, err := m.opt.Ledger.Release(context.WithoutCancel(ctx), sb.ID); err != nil {
		m.log.Error("release sandbox resources", "sandbox", sb.ID, "err", err)
	}
}

// reap terminates sandboxes past their idle timeout or lifetime.
func (m *Manager) reap(ctx context.Context) {
	defer close(m.reaperDone)
	t := time.NewTicker(m.opt.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := m.opt.Now()
		m.mu.Lock()
		var victims, sleepers []*Sandbox
		var reasons []string
		for _, sb := range m.sandboxes {
			sb.mu.Lock()
			life, age := m.lifetime(sb.spec), now.Sub(sb.createdAt)
			switch {
			case sb.state == StateCreating || sb.terminating || sb.pooled:
			case sb.spec.PauseOnExpiry && sb.spec.TTL > 0 && age >= sb.spec.TTL && (m.opt.MaxLifetime == 0 || age < m.opt.MaxLifetime):
				if sb.state == StateReady || sb.state == StateRunning {
					sleepers = append(sleepers, sb)
				}
			case life > 0 && age >= life:
				victims, reasons = append(victims, sb), append(reasons, fmt.Sprintf("lifetime of %s reached", life))
			case m.opt.IdleTimeout > 0 && sb.state == StateReady && now.Sub(sb.lastActive) >= m.opt.IdleTimeout:
				victims, reasons = append(victims, sb), append(reasons, fmt.Sprintf("idle for %s", m.opt.IdleTimeout))
			}
			sb.mu.Unlock()
		}
		m.mu.Unlock()
		for _, sb := range sleepers {
			m.log.Info("pausing sandbox", "sandbox", sb.ID, "reason", "its timeout passed (pause on expiry)")
			if _, err := m.pause(ctx, sb.ID, "timeout passed: paused"); err != nil {
				m.log.Error("pause sandbox", "sandbox", sb.ID, "err", err)
			}
		}
		for i, sb := range victims {
			m.log.Info("reaping sandbox", "sandbox", sb.ID, "reason", reasons[i])
			if _, err := m.Terminate(ctx, sb.ID, reasons[i]); err != nil {
				m.log.Error("reap sandbox", "sandbox", sb.ID, "err", err)
			}
		}
	}
}

// Usage is a sandbox's current resource usage.
type Usage = apitypes.Usage

// Usage reads the live usage of sandbox id from its backend.
func (m *Manager) Usage(ctx context.Context, id string) (*Usage, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	h := sb.handle
	sb.mu.Unlock()
	if h == nil {
		return nil, errdefs.Conflictf("sandbox %s is still starting", id)
	}
	u, err := h.Usage(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read usage of %s", id)
	}
	return u, nil
}

// IDs returns the ids of the live sandboxes, sorted.
func (m *Manager) IDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.sandboxes))
	for id := range m.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// SetTTL sets how long sandbox id may live, counted from its creation (the
// reaper terminates it then, within the configured max lifetime), and
// records it so that a restarted daemon keeps it.
func (m *Manager) SetTTL(ctx context.Context, id string, ttl time.Duration) (*Info, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := sb.acceptsWork(); err != nil {
		return nil, err
	}
	sb.mu.Lock()
	sb.spec.TTL = ttl
	specJSON, err := json.Marshal(sb.spec)
	sb.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := m.opt.Store.UpdateSandbox(ctx, id, func(r *store.SandboxRecord) { r.Spec = specJSON }); err != nil {
		return nil, err
	}
	return m.Get(ctx, id)
}

// SetNetwork records a running sandbox's new network mode and allowlist
// (the network subsystem has applied them), so that its description and a
// restarted daemon's adoption use them.
func (m *Manager) SetNetwork(ctx context.Context, id, mode string, allow []string) error {
	sb, _, err := m.live(ctx, id, CapExec)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.spec.Network, sb.spec.Allow = mode, slices.Clone(allow)
	specJSON, err := json.Marshal(sb.spec)
	sb.mu.Unlock()
	if err != nil {
		return err
	}
	return m.opt.Store.UpdateSandbox(ctx, id, func(r *store.SandboxRecord) { r.Spec = specJSON })
}
