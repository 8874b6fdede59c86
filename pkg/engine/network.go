package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// initNetwork starts the network subsystem with its host side in the
// network namespace of the calling thread: the daemon's own (tests call
// New from a thread inside a namespace they made). A failure leaves e.net
// nil: sandboxes with network are refused naming the reason, readiness
// reports it, everything else works — except when the configuration names
// another daemon's bridge, range or table (hostclaim): that error is
// returned and the daemon does not start, since its gc and reconcile
// would take the other's sandboxes for its own leftovers.
func (e *Engine) initNetwork() error {
	mirror := e.cfg.Images.Mirror
	if mirror == "" {
		mirror, _ = image.HostMirror() // only for the @debian preset
	}
	cfg, err := network.FromConfig(e.cfg.Network, e.cfg.Paths.RunDir, mirror)
	if err != nil {
		e.netErr = err
		return nil
	}
	cfg.Log = e.log
	cfg.Owner = e.cfg.Paths.StateDir
	hostNS, err := netns.Get()
	if err != nil {
		e.netErr = fmt.Errorf("network namespace of the daemon: %w", err)
		return nil
	}
	// The manager keeps the handle for the daemon's life.
	m, err := network.New(cfg, hostNS, e.store)
	if err != nil {
		hostNS.Close()
		var inUse *hostclaim.InUseError
		var marked *hostclaim.MarkedError
		if errors.As(err, &inUse) || errors.As(err, &marked) {
			return err
		}
		e.netErr = err
		e.log.Error("network subsystem unavailable; only network mode none works", "err", err)
		return nil
	}
	e.net, e.netCfg = m, cfg
	e.ledger.Register(network.KindNetNS, func(_ context.Context, r ledger.Resource) error { return m.ReleaseNetNS(r.Key) })
	e.ledger.Register(network.KindVeth, func(_ context.Context, r ledger.Resource) error { return m.ReleaseVeth(r.Key) })
	e.ledger.Register(network.KindNft, func(_ context.Context, r ledger.Resource) error { return m.ReleaseRules(r.Key) })
	e.ledger.Register(network.KindLease, func(ctx context.Context, r ledger.Resource) error { return m.ReleaseLease(ctx, r.Key) })
	e.ledger.Register(network.KindCredential, func(_ context.Context, r ledger.Resource) error { return m.ReleaseCredential(r.Key) })
	return nil
}

// networkRequest is a sandbox's network request.
func networkRequest(mode string, allow, credentials []string, l apitypes.Limits) network.Request {
	return network.Request{
		Credentials: credentials,
		Policy:      network.Policy{Mode: network.Mode(mode), Allow: allow},
		Limits:      network.Limits{BandwidthBytes: uint64(max(l.NetworkBandwidth, 0)), ConnPerSecond: uint32(min(max(l.NetworkConnRate, 0), 1<<31))},
	}
}

// networkLimits applies the configured defaults and the request's values
// to spec's network limits; the manager checks them against the caps.
func (e *Engine) networkLimits(spec *sandbox.Spec, req CreateSandboxRequest) error {
	def := network.DefaultLimits(e.cfg.Network)
	spec.Limits.NetworkBandwidth, spec.Limits.NetworkConnRate = int64(def.BandwidthBytes), int64(def.ConnPerSecond)
	for _, f := range []struct {
		name string
		v    *int64
		dst  *int64
	}{{"network_bandwidth", req.NetworkBandwidth, &spec.Limits.NetworkBandwidth}, {"network_conn_rate", req.NetworkConnRate, &spec.Limits.NetworkConnRate}} {
		if f.v == nil {
			continue
		}
		if spec.Network == NetworkNone {
			return errdefs.Invalidf("%s: only valid with network egress or allowlist", f.name)
		}
		if *f.v < 0 || *f.v > 1<<40 {
			return errdefs.Invalidf("%s: %d is out of range (0: unlimited)", f.name, *f.v)
		}
		*f.dst = *f.v
	}
	if spec.Network == NetworkNone {
		spec.Limits.NetworkBandwidth, spec.Limits.NetworkConnRate = 0, 0
	}
	return nil
}

// networkHook is the sandbox manager's Network hook.
type networkHook struct{ e *Engine }

func (h networkHook) Attach(ctx context.Context, id string, spec sandbox.Spec, rec ledger.Recorder) (sandbox.NetworkAttachment, error) {
	a, err := h.e.net.Attach(ctx, id, networkRequest(spec.Network, spec.Allow, spec.Credentials, spec.Limits), func(kind, key string) error {
		return rec.Record(ctx, ledger.Resource{Kind: kind, Key: key})
	})
	if err != nil {
		return sandbox.NetworkAttachment{}, err
	}
	// Only the credential variables: the package-index ones are in the
	// spec's Env already (sandboxSpec), where the client's values win.
	var env map[string]string
	for _, kv := range a.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && isCredentialVar(h.e.netCfg, k) {
			if env == nil {
				env = map[string]string{}
			}
			env[k] = v
		}
	}
	return sandbox.NetworkAttachment{NetNSPath: a.NetNSPath, ResolvConf: a.ResolvConf, Env: env}, nil
}

// isCredentialVar tells whether k is a sandbox variable of a credential.
func isCredentialVar(cfg network.Config, k string) bool {
	for _, c := range cfg.Credentials {
		if k == c.BaseURLEnv || k == c.KeyEnv {
			return true
		}
	}
	return false
}

// adoptNetworks gives the sandboxes reconciliation adopted their network
// state back (address, rules, the DNS forwarder), then removes network
// pieces no live sandbox owns.
func (e *Engine) adoptNetworks(ctx context.Context, rep *sandbox.GCReport) {
	if e.net == nil {
		return
	}
	infos, err := e.sandboxes.List(ctx)
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("network: list sandboxes: %v", err))
		return
	}
	live := map[string]bool{}
	for _, in := range infos {
		if !in.State.Live() {
			continue
		}
		live[in.ID] = true
		if in.Network == "" || in.Network == NetworkNone {
			continue
		}
		if _, err := e.net.Attach(ctx, in.ID, networkRequest(in.Network, in.Allow, in.Credentials, in.Limits), nil); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("network: adopt %s: %v", in.ID, err))
		}
	}
	e.networkGC(ctx, rep, func(id string) bool { return live[id] })
}

func (e *Engine) networkGC(ctx context.Context, rep *sandbox.GCReport, live func(string) bool) {
	nrep, err := e.net.GC(ctx, live)
	for _, x := range nrep.Leases {
		rep.Removed = append(rep.Removed, "network lease of "+x)
	}
	for _, x := range nrep.Veths {
		rep.Removed = append(rep.Removed, "veth "+x)
	}
	for _, x := range nrep.Rules {
		rep.Removed = append(rep.Removed, "nftables rules "+x)
	}
	for _, x := range nrep.Namespaces {
		rep.Removed = append(rep.Removed, "network namespace "+x)
	}
	if nrep.HostSide {
		rep.Removed = append(rep.Removed, "network host side (table "+e.net.Table()+", bridge, ip_forward)")
	}
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("network gc: %v", err))
	}
}

// withPackageIndexes adds the package index variables to env without
// overriding what the client set.
func withPackageIndexes(env map[string]string, vars []string) map[string]string {
	if len(vars) == 0 {
		return env
	}
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	for _, kv := range vars {
		k, v, _ := strings.Cut(kv, "=")
		if _, set := out[k]; !set {
			out[k] = v
		}
	}
	return out
}

// SandboxNetworkRequest is the input of sandbox_network.
type SandboxNetworkRequest = apitypes.SandboxNetworkRequest

// SandboxNetwork changes a running sandbox's network mode and allowlist, or
// with neither given, reports them with the counters.
func (e *Engine) SandboxNetwork(ctx context.Context, req SandboxNetworkRequest) (*apitypes.NetworkStatus, error) {
	if err := checkSandboxID(req.SandboxID); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Get(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if !info.State.Live() {
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", req.SandboxID, info.State)
	}
	if info.Network == "" || info.Network == NetworkNone {
		// Its namespace is the runtime's own, with loopback only.
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s was created with network none, which cannot change; create it with network egress or allowlist", req.SandboxID)
	}
	if e.net == nil {
		return nil, errdefs.Unavailablef("network: the network subsystem did not start (%s)", e.netErr)
	}
	if req.Mode == "" && req.Allow == nil {
		return e.networkStatus(req.SandboxID)
	}
	mode := req.Mode
	if mode == "" {
		mode = info.Network
	}
	if mode == NetworkNone {
		return nil, errdefs.Invalidf("mode: a running sandbox can switch between egress and allowlist only")
	}
	if _, err := e.networkMode("mode", mode); err != nil {
		return nil, err
	}
	if len(req.Allow) > 0 && mode != NetworkAllowlist {
		return nil, errdefs.Invalidf("allow: only valid with mode %q", NetworkAllowlist)
	}
	if _, err := e.net.SetPolicy(ctx, req.SandboxID, network.Policy{Mode: network.Mode(mode), Allow: req.Allow}, nil); err != nil {
		return nil, err
	}
	if err := e.sandboxes.SetNetwork(ctx, req.SandboxID, mode, req.Allow); err != nil {
		return nil, err
	}
	return e.networkStatus(req.SandboxID)
}

func (e *Engine) networkStatus(id string) (*apitypes.NetworkStatus, error) {
	st, err := e.net.Status(id)
	if err != nil {
		return nil, err
	}
	return &apitypes.NetworkStatus{Mode: string(st.Mode), Allow: st.Allow, Counters: apitypes.NetworkCounters{
		Allowed: st.Counters.Allowed, Denied: st.Counters.Denied, DeniedDestinations: st.Counters.DeniedDestinations,
	}}, nil
}

// NetworkWatch is one front-end call's view of its sandbox's DNS
// refusals, and, with Approve, its say over them while the lookup is held
// (network.Watch; docs/mcp.md, network approvals).
type NetworkWatch = network.Watch

// WatchNetwork makes w see the names sandbox id is refused (and decide
// them, with Approve) until ctx ends or stop is called. The sandbox must
// be the caller's, live, and created with network egress or allowlist.
func (e *Engine) WatchNetwork(ctx context.Context, id string, w NetworkWatch) (stop func(), err error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !info.State.Live() {
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, info.State)
	}
	if info.Network == "" || info.Network == NetworkNone {
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s has network none: nothing to watch", id)
	}
	if e.net == nil {
		return nil, errdefs.Unavailablef("network: the network subsystem did not start (%s)", e.netErr)
	}
	return e.net.Watch(ctx, id, w)
}

type networkWatchKey struct{}

// WithNetworkWatch returns ctx for a call that makes its own sandbox
// (run_code without sandbox_id): the allowlist sandbox the engine
// creates for it is watched by w until ctx ends. The sandbox's id is
// not the caller's to know before the call returns, hence a context
// value rather than WatchNetwork.
func WithNetworkWatch(ctx context.Context, w NetworkWatch) context.Context {
	return context.WithValue(ctx, networkWatchKey{}, w)
}

// NetworkWatchFrom is the watch WithNetworkWatch put in ctx.
func NetworkWatchFrom(ctx context.Context) (NetworkWatch, bool) {
	w, ok := ctx.Value(networkWatchKey{}).(NetworkWatch)
	return w, ok
}

// CreateSandbox is the engine's, plus the watch of WithNetworkWatch for
// the services' sandboxes (a run's fresh sandbox).
func (l lifecycle) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*sandbox.Info, error) {
	info, err := l.Engine.CreateSandbox(ctx, req)
	if err != nil {
		return info, err
	}
	if w, ok := NetworkWatchFrom(ctx); ok && l.net != nil && info.Network == NetworkAllowlist {
		// Ended by ctx, the call's: the run's sandbox goes with it.
		if _, err := l.net.Watch(ctx, info.ID, w); err != nil {
			l.log.Warn("network watch of a run's sandbox", "sandbox", info.ID, "err", err)
		}
	}
	return info, nil
}
