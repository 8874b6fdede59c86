package engine

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/images"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/snapshots"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The composition root: New makes every subsystem once, in dependency
// order — the stores, the container backend, the sandbox service (with the
// VM backend and the network beside it), then the services over it
// (registerServices, the one place a service is added) — and starts their
// background work. Each step undoes what it opened when it fails.

// New opens the state directory and starts the engine's background work. The
// caller must hold the state directory's lock (see cmd/mcp-sandboxd).
func New(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Engine, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := checkBuilt(cfg); err != nil {
		return nil, err
	}
	if err := checkUsernsPool(cfg.Sandbox.UsernsPool); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: log, seccomp: seccomp.Check(), started: time.Now()}
	e.metrics = newMetrics(e)
	if err := e.openStores(ctx); err != nil {
		return nil, err
	}
	backend, err := e.newContainerBackend()
	if err != nil {
		_ = e.store.Close()
		return nil, err
	}
	cleanup := func() { _ = e.disks.Close(); e.diskStore.Close(); _ = e.store.Close() }
	if err := e.newSandboxService(backend); err != nil {
		cleanup()
		return nil, err
	}
	if err := e.registerServices(); err != nil {
		cleanup()
		return nil, err
	}
	if err := e.restore(ctx); err != nil {
		cleanup()
		return nil, err
	}
	e.pruneArtifacts()
	e.pruneStaleImages(ctx)
	e.sandboxes.Start()
	e.snapshots.Start()
	return e, nil
}

// openStores opens the state database, the image store and the recipe
// catalog; on failure it leaves nothing open.
func (e *Engine) openStores(ctx context.Context) error {
	var err error
	if e.store, err = store.Open(ctx, filepath.Join(e.cfg.Paths.StateDir, "state.db")); err != nil {
		return fmt.Errorf("open state database: %w", err)
	}
	if e.images, err = image.OpenStore(e.imagesDir()); err != nil {
		_ = e.store.Close()
		return fmt.Errorf("open image store: %w", err)
	}
	recipes, err := image.LoadRecipes(e.cfg.Paths.RecipesDir)
	if err != nil {
		_ = e.store.Close()
		return fmt.Errorf("load recipes: %w", err)
	}
	e.catalog = lang.NewCatalog(recipes, e.cfg.Images.Languages)
	return nil
}

// newContainerBackend makes the runtime, the seccomp profiles, the ledger,
// the disk store and its pool of ready disks, and the container backend
// over them. On failure it closes the disks it opened (the caller closes
// the state database).
func (e *Engine) newContainerBackend() (sandbox.Backend, error) {
	cfg, log := e.cfg, e.log
	var err error
	if e.runtime, err = runtime.New(filepath.Join(cfg.Paths.RunDir, "runtime"), log); err != nil {
		return nil, err
	}
	// Every profile is resolved for each mode's capability set (see
	// runtime.AgentCapabilities).
	prof, err := e.loadSeccomp(runtime.AgentCapabilities)
	if err != nil {
		return nil, err
	}
	rootProf, err := e.loadSeccomp(runtime.RootModeCapabilities)
	if err != nil {
		return nil, err
	}
	if prof == nil {
		e.log.Warn("seccomp is turned off by configuration (sandbox.seccomp_profile: unconfined)")
	} else if !e.seccomp.OK() {
		e.log.Error("seccomp cannot be enforced; sandboxes will not start", "reason", e.seccomp.Reason)
	}
	if e.seccompProfiles, err = e.loadSeccompProfiles(runtime.AgentCapabilities); err != nil {
		return nil, err
	}
	rootProfiles, err := e.loadSeccompProfiles(runtime.RootModeCapabilities)
	if err != nil {
		return nil, err
	}
	e.ledger = ledger.New(e.store)
	if cfg.Sandbox.CgroupFavorDynMods {
		// A host-wide mount option (cgroups.FavorDynMods says why): said
		// aloud when changed; a failure costs only exec latency.
		if changed, err := cgroups.FavorDynMods(); err != nil {
			log.Warn("cgroup2 favordynmods not set: each command's cgroup move may wait for an RCU grace period", "err", err)
		} else if changed {
			log.Info("set favordynmods on the host's cgroup2 hierarchy (sandbox.cgroup_favordynmods)")
		}
	}
	disks, err := storage.NewStore(cfg.Paths.SandboxesDirOrDefault())
	if err != nil {
		return nil, err
	}
	// Ready disks of the default geometry keep the disk backing's create
	// as fast as a tmpfs's (docs/storage.md "Ready disks" and
	// "Benchmark"); two cover a burst of creates while the pool refills
	// in the background.
	if e.disks, err = disks.NewPool(int64(cfg.Sandbox.Disk), storage.DefaultInodes(int64(cfg.Sandbox.Disk)), readyDisks, log); err != nil {
		disks.Close()
		return nil, err
	}
	e.diskStore = disks
	if cfg.Sandbox.DiskBacking == storage.BackingDisk {
		e.disks.Fill()
	}
	backend, err := container.New(container.Options{
		Runtime: e.runtime, Seccomp: prof, SeccompProfiles: e.seccompProfiles,
		RootSeccomp: rootProf, RootSeccompProfiles: rootProfiles,
		SeccompDiagnostics: cfg.Sandbox.SeccompDiagnostics && seccomp.MonitorSupported,
		AgentPath:          cfg.Paths.AgentPath, RunDir: cfg.Paths.RunDir, Storage: disks, Pool: e.disks,
		CgroupParent: cfg.Sandbox.CgroupParent, IO: e.ioLimits(), Log: log,
		Userns: usernsPool(cfg.Sandbox.UsernsPool, e.store),
	}, e.ledger)
	if err != nil {
		_ = e.disks.Close()
		disks.Close()
		return nil, err
	}
	return backend, nil
}

// newSandboxService makes the sandbox manager over the container backend,
// the VM backend when enabled and the network when it started.
func (e *Engine) newSandboxService(backend sandbox.Backend) error {
	cfg := e.cfg
	var more []sandbox.Backend
	if vb := e.initVM(); vb != nil {
		more = append(more, vb)
	}
	var netHook sandbox.Network
	if e.initNetwork(); e.net != nil {
		netHook = networkHook{e}
	}
	var err error
	e.sandboxes, err = sandbox.NewManager(sandbox.Options{
		Store: e.store, Images: e.images, Backend: backend, Backends: more, Ledger: e.ledger, Network: netHook,
		MaxSandboxes: cfg.Sandbox.MaxSandboxes, IdleTimeout: cfg.Sandbox.IdleTimeout.D(),
		MaxLifetime: cfg.Sandbox.MaxLifetime.D(), OutputLimit: int64(cfg.Sandbox.OutputLimit), Log: e.log,
		Pool: cfg.Sandbox.Pool,
		PoolSpec: func(image string) (sandbox.Spec, error) {
			spec, err := e.sandboxSpec(CreateSandboxRequest{Language: image})
			if err != nil {
				return sandbox.Spec{}, err
			}
			return *spec, nil
		},
		OnTransition: func(id string, _, to sandbox.State, _ string) {
			e.metrics.terminations.WithLabelValues(string(to)).Inc()
			if ports.Ends(to) && e.ports != nil { // nil only before registerServices
				e.ports.End(id)
			}
		},
	})
	return err
}

// registerServices makes the services over the sandbox service: the one
// place a service is added. Each takes only the narrow interfaces its
// package declares.
func (e *Engine) registerServices() error {
	cfg, log := e.cfg, e.log
	e.imgs = images.New(images.Options{
		Store: e.images, Catalog: e.catalog, Config: &cfg.Images, RecipesDir: cfg.Paths.RecipesDir,
		Sandboxes: liveSandboxes{e}, Log: log,
		OnBuild: func(name, outcome string) { e.metrics.imageBuilds.WithLabelValues(name, outcome).Inc() },
		MaxID:   usernsIDs(cfg.Sandbox.UsernsPool),
	})
	e.ports = ports.New(e.sandboxes, e.store, log)
	deps := agentDeps{e}
	e.agents = agents.New(agents.Options{Sandboxes: deps, Images: e.imgs, Records: deps, Credentials: deps,
		MaxLifetime: cfg.Sandbox.MaxLifetime.D()})
	e.snapshots = snapshots.New(e.sandboxes, e.store, cfg.Snapshots, cfg.Paths.StateDir, log)
	return e.initRuns()
}

// restore reconciles the sandboxes a previous run of the daemon left, and
// what hangs on them: their networks and preview exposures.
func (e *Engine) restore(ctx context.Context) error {
	rep, err := e.sandboxes.Reconcile(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	e.adoptNetworks(ctx, rep)
	if err := e.ports.Load(ctx); err != nil {
		e.log.Error("restore preview exposures", "err", err)
	}
	e.log.Info("reconciled state", "adopted", len(rep.Adopted), "terminated", len(rep.Terminated),
		"removed", len(rep.Removed), "errors", len(rep.Errors))
	for _, msg := range rep.Errors {
		e.log.Error("reconcile", "err", msg)
	}
	return nil
}
