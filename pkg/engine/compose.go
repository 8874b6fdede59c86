package engine

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/volumes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/tenants"
)

// The engine's core and its start. Open makes the core once, in dependency
// order — the stores, the container backend, the sandbox service (with the
// VM backend and the network beside it) — and each step undoes what it
// opened when it fails. The services over the core are made elsewhere
// (services.Compose, the one place a service is added) by the daemon's
// composition root (cmd/mcp-sandboxd), which hands them to Start; New does
// the same three steps for tests and embedders.

// New opens the engine's core, composes its services and starts it: Open,
// services.Compose, Start. The caller must hold the state directory's lock
// (see cmd/mcp-sandboxd).
func New(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Engine, error) {
	e, err := Open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	if err := e.Start(ctx, services.Compose(e.Core())); err != nil {
		return nil, err
	}
	return e, nil
}

// Open opens the state directory and makes the engine's core: stores,
// backends, network and the sandbox service. It starts no background work
// and has no services until Start.
func Open(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Engine, error) {
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
	// A drain outlives the daemon (node.go): a node restarted during
	// maintenance does not take creates before the operator ends it.
	e.draining.Store(readDrain(cfg.Paths.StateDir))
	if err := e.openStores(ctx); err != nil {
		return nil, err
	}
	if err := e.openAudit(); err != nil {
		e.tenants.Close()
		_ = e.closeStores()
		return nil, err
	}
	backend, err := e.newContainerBackend()
	if err != nil {
		_ = e.audit.Close()
		e.tenants.Close()
		_ = e.closeStores()
		return nil, err
	}
	if err := e.newSandboxService(backend); err != nil {
		e.closeCore()
		return nil, err
	}
	if err := e.openVolumes(); err != nil {
		e.closeCore()
		return nil, err
	}
	return e, nil
}

// closeCore closes what Open opened, when the engine does not start.
func (e *Engine) closeCore() {
	_ = e.disks.Close()
	e.diskStore.Close()
	if e.volumeDisks != nil {
		e.volumeDisks.Close()
	}
	_ = e.audit.Close()
	e.tenants.Close()
	_ = e.closeStores()
}

// Core is what the services are made over (services.Compose): the core's
// parts and the engine's narrow views of itself.
func (e *Engine) Core() services.Core {
	return services.Core{
		Config: e.cfg, Log: e.log, Sandboxes: e.sandboxes, Store: e.store, Images: e.images, Catalog: e.catalog,
		Engine: lifecycle{e}, Registerer: e.metrics.registry, Metrics: runMetrics{e.metrics},
		OnImageBuild: func(name, outcome string) { e.metrics.imageBuilds.WithLabelValues(name, outcome).Inc() },
		Credentials:  credentials{e},
		MaxImageID:   usernsIDs(e.cfg.Sandbox.UsernsPool),
		Audit:        e.audit,
	}
}

// Start takes the services, reconciles what a previous run of the daemon
// left and starts the background work. On failure it closes the core.
func (e *Engine) Start(ctx context.Context, set *services.Set) error {
	e.imgs, e.ports, e.pipeline, e.agents, e.fixes, e.snapshots = set.Images, set.Ports, set.Pipeline, set.Agents, set.Fixes, set.Snapshots
	// A preview exposure lives only as long as the key that made it.
	e.ports.SetKeyCheck(e.tenants.Valid)
	e.sshKeys = set.SSHKeys
	// Lifecycle webhooks take every lifecycle event at the manager's one
	// seam; deliveries a previous run left pending resume.
	e.webhooks = set.Webhooks
	e.sandboxes.OnLifecycle(e.webhooks.Announce)
	if err := e.pipeline.Open(); err != nil {
		e.closeCore()
		return err
	}
	if err := e.restore(ctx); err != nil {
		e.closeCore()
		return err
	}
	e.pruneArtifacts()
	e.pruneStaleImages(ctx)
	e.sandboxes.Start()
	e.snapshots.Start()
	e.webhooks.Start()
	return nil
}

// closeStores closes the state database and the fleet's, if open.
func (e *Engine) closeStores() error {
	if e.fleet != nil {
		e.fleet.Close()
	}
	return e.store.Close()
}

// openStores opens the state database, the image store and the recipe
// catalog; on failure it leaves nothing open.
func (e *Engine) openStores(ctx context.Context) error {
	var err error
	if e.store, err = store.Open(ctx, filepath.Join(e.cfg.Paths.StateDir, "state.db")); err != nil {
		return fmt.Errorf("open state database: %w", err)
	}
	if e.images, err = image.OpenStore(e.imagesDir()); err != nil {
		_ = e.closeStores()
		return fmt.Errorf("open image store: %w", err)
	}
	recipes, err := image.LoadRecipes(e.cfg.Paths.RecipesDir)
	if err != nil {
		_ = e.closeStores()
		return fmt.Errorf("load recipes: %w", err)
	}
	e.catalog = lang.NewCatalog(recipes, e.cfg.Images.Languages)
	// The keys of the store; the daemon adds the files' keys
	// (Tenants().SetFileKeys) once it has read them.
	// With store.postgres_url the keys live in the fleet's database that
	// every gateway and daemon shares, and changes there are watched.
	var keys tenants.KeyStore = e.store
	if url := e.cfg.Store.PostgresURL; url != "" {
		if e.fleet, err = pgstore.Open(ctx, url); err != nil {
			_ = e.closeStores()
			return fmt.Errorf("open the fleet's database (store.postgres_url): %w", err)
		}
		keys = e.fleet
	}
	if e.tenants, err = tenants.New(ctx, tenants.Options{Store: keys, Log: e.log.With("component", "tenants")}); err != nil {
		_ = e.closeStores()
		return fmt.Errorf("load api keys: %w", err)
	}
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
	// sandbox-init, installed beside the agent, is every container's
	// `runc init` (pkg/runtime/initexec.go); without it the daemon itself
	// is, about 16 ms slower per start.
	initBin := filepath.Join(filepath.Dir(cfg.Paths.AgentPath), runtime.InitBinaryName)
	if err := e.runtime.UseInitBinary(initBin); err != nil {
		log.Warn("sandbox-init unavailable, containers start with the daemon as their init", "err", err)
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
	// Decided once: the kernel's Landlock does not change while the
	// daemon runs. require without it is a start error naming the setting.
	if e.landlock, err = landlock.Detect(landlock.Mode(cfg.Sandbox.Landlock)); err != nil {
		return nil, err
	}
	if !e.landlock.Enforce && e.landlock.Mode != landlock.ModeOff {
		e.log.Warn("sandboxes run without Landlock", "reason", e.landlock.Reason)
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
		Landlock:           e.landlock.Enforce,
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
	if err := e.initNetwork(); err != nil {
		return err
	}
	if e.net != nil {
		netHook = networkHook{e}
	}
	var err error
	e.sandboxes, err = sandbox.NewManager(sandbox.Options{
		Store: e.store, Images: e.images, Backend: backend, Backends: more, Ledger: e.ledger, Network: netHook,
		MaxSandboxes: cfg.Sandbox.MaxSandboxes, NodeName: cfg.Node.Name, IdleTimeout: cfg.Sandbox.IdleTimeout.D(),
		MaxLifetime: cfg.Sandbox.MaxLifetime.D(), OutputLimit: int64(cfg.Sandbox.OutputLimit), Log: e.log,
		Pool: cfg.Sandbox.Pool,
		PoolSpec: func(image string) (sandbox.Spec, error) {
			if name, ok := strings.CutPrefix(image, sandbox.TemplatePoolKey("")); ok {
				return e.templatePoolSpec(name)
			}
			spec, err := e.sandboxSpec(CreateSandboxRequest{Language: image})
			if err != nil {
				return sandbox.Spec{}, err
			}
			return *spec, nil
		},
		Admit: func(ctx context.Context, l sandbox.Limits) (func(), error) {
			release, err := e.tenants.Admit(ctx, l, e.sandboxes.HeldBy)
			if errdefs.Is(err, errdefs.LimitExceeded) {
				e.announceQuota(ctx, err)
			}
			return release, err
		},
		PoolReady: func(ctx context.Context, id, key string) error {
			name, ok := strings.CutPrefix(key, sandbox.TemplatePoolKey(""))
			if !ok {
				return nil
			}
			_, t, err := e.template(ctx, "template", name)
			if err != nil {
				return err
			}
			return e.readyTemplate(ctx, id, t)
		},
		OnTransition: func(id string, _, to sandbox.State, _ string) {
			e.metrics.terminations.WithLabelValues(string(to)).Inc()
			if ports.Ends(to) && e.ports != nil { // nil only before Start
				e.ports.End(id)
			}
		},
	})
	return err
}

// openVolumes opens the named volumes' service, part of the core: a
// volume is disk like a sandbox's, mounted by the sandbox service's
// backend. Volume images live apart from sandboxes' (never in
// sandboxes_dir, which the container backend's scan and gc read).
func (e *Engine) openVolumes() error {
	cfg := e.cfg
	vdisks, err := storage.NewStore(cfg.Volumes.DirOrDefault(cfg.Paths.StateDir))
	if err != nil {
		return err
	}
	e.volumeDisks = vdisks
	e.volumes, err = volumes.New(volumes.Options{
		Store: e.store, Sandboxes: e.sandboxes, Ledger: e.ledger, Disks: vdisks,
		MountDir: filepath.Join(cfg.Paths.RunDir, "volumes"), Config: &cfg.Volumes, Owner: cfg.Sandbox.User, Log: e.log,
	})
	return err
}

// restore reconciles the sandboxes a previous run of the daemon left, and
// what hangs on them: their networks and preview exposures.
func (e *Engine) restore(ctx context.Context) error {
	// Volumes first: a create interrupted by the crash is undone, a ready
	// volume mounted again where it is not (a host restart).
	if err := e.volumes.Load(ctx); err != nil {
		e.log.Error("restore volumes", "err", err)
	}
	if err := e.loadTemplatePools(ctx); err != nil {
		e.log.Error("restore template pools", "err", err)
	}
	rep, err := e.sandboxes.Reconcile(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	e.adoptNetworks(ctx, rep)
	e.pipeline.EndInterrupted(ctx, rep.Adopted)
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
