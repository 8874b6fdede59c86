// Package engine is SandboxRunner's one API. Every operation — creating a
// sandbox, running a command, moving files — is implemented once, here or in
// one of the services under pkg/services (snapshots, preview ports, images)
// that New composes (compose.go), and called by every front end through the
// engine: the MCP tools, the REST API and sandboxctl (through REST). The
// engine validates input (every error names its field and carries a taxonomy
// code from pkg/errdefs), applies the configured defaults and caps, and
// delegates to the lifecycle packages below it.
package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/fixloop"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/images"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/snapshots"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/volumes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/tenants"
)

// Engine wires the stores, the runtime and the sandbox manager together.
type Engine struct {
	cfg       *config.Config
	draining  atomic.Bool // node.go: no creates while set
	log       *slog.Logger
	store     *store.Store
	fleet     *pgstore.Store // the keys' store with store.postgres_url; nil on one machine
	audit     *audit.Log     // nil when audit.enabled is false
	images    *image.Store
	catalog   *lang.Catalog
	runtime   *runtime.Runtime
	ledger    *ledger.Ledger
	diskStore *storage.Store // image files of disk-backed sandboxes
	disks     *storage.Pool  // ready disks for disk-backed sandboxes
	sandboxes *sandbox.Manager
	tenants   *tenants.Service // API keys, the authenticator, quotas
	netCfg    network.Config
	net       *network.Manager // nil if the network subsystem could not start (netErr says why)
	netErr    error
	seccomp   seccomp.Support
	landlock  landlock.Support // what container sandboxes' agents enforce
	requestMu sync.Mutex       // serialises creates that carry a request_id
	// seccompProfiles are the profiles creates may choose (seccomp_profile).
	seccompProfiles map[string]*specs.LinuxSeccomp
	metrics         *metrics
	started         time.Time
	pipeline        *pipeline.Service  // run_code, run_task, packages_install, run records (pkg/services/pipeline)
	fixes           *fixloop.Service   // autofix loops (pkg/services/fixloop)
	imgs            *images.Service    // images: list, build, prune, build on first use (pkg/services/images)
	ports           *ports.Service     // preview exposures (pkg/services/ports)
	vm              vmState            // the VM backend (vm.go)
	snapshots       *snapshots.Service // workspace and machine snapshots (pkg/services/snapshots)
	agents          *agents.Service    // agent sessions (pkg/services/agents)
	sshState                           // SSH identities and host key (ssh.go, pkg/services/sshkeys)
	volumes         *volumes.Service   // named volumes (pkg/services/volumes)
	volumeDisks     *storage.Store     // image files of named volumes
	webhooks        *webhooks.Service  // lifecycle webhooks (webhooks.go, pkg/services/webhooks)

	// e2bPort and previewPort are the listeners' ports NodeStatus
	// reports (node.go).
	e2bPort, previewPort atomic.Int64
}

// unbuilt names the configuration sections whose subsystems this build does
// not have yet, and what they are.
var unbuilt = []struct{ section, what string }{}

// checkBuilt refuses a configuration that sets what this build would
// silently ignore: every such key is named.
func checkBuilt(cfg *config.Config) error {
	var errs []error
	for _, u := range unbuilt {
		for _, key := range cfg.NonDefault(u.section) {
			errs = append(errs, fmt.Errorf("config: %s: not available yet: this build has no %s; leave it at its default", key, u.what))
		}
	}
	return errors.Join(errs...)
}

// ioLimits resolves the configured block I/O throttles to the disk that holds
// the images. Without an I/O controller they are skipped with a warning.
func (e *Engine) ioLimits() container.IOLimits {
	sc := e.cfg.Sandbox
	if sc.IOReadBPS == 0 && sc.IOWriteBPS == 0 {
		return container.IOLimits{}
	}
	if !cgroups.IOControllerAvailable() {
		e.log.Warn("sandbox.io_read_bps/io_write_bps ignored: no block I/O controller on this host")
		return container.IOLimits{}
	}
	dev, err := cgroups.BlockDeviceOf(e.imagesDir())
	if err != nil {
		e.log.Warn("sandbox.io_read_bps/io_write_bps ignored", "err", err)
		return container.IOLimits{}
	}
	return container.IOLimits{Device: dev, ReadBPS: uint64(sc.IOReadBPS), WriteBPS: uint64(sc.IOWriteBPS)}
}

func (e *Engine) imagesDir() string {
	if e.cfg.Paths.ImagesDir != "" {
		return e.cfg.Paths.ImagesDir
	}
	return filepath.Join(e.cfg.Paths.StateDir, "images")
}

// loadSeccomp resolves the configured profile for a capability bounding
// set; nil when unconfined. A profile that cannot be enforced is not an
// error here: sandbox creation refuses instead, and readiness reports why,
// so an operator can still reach the daemon.
func (e *Engine) loadSeccomp(caps []string) (*specs.LinuxSeccomp, error) {
	name := e.cfg.Sandbox.SeccompProfile
	if name == seccomp.Unconfined {
		return nil, nil
	}
	prof, err := seccomp.Load(e.cfg.Paths.SeccompDir, name, caps, seccompRules(e.cfg.Sandbox.SeccompRules[name])...)
	if err != nil {
		return nil, fmt.Errorf("sandbox.seccomp_profile: %w", err)
	}
	return prof, nil
}

// loadSeccompProfiles loads every profile of seccomp_dir with the rules the
// configuration adds to it, for creates that choose one by name, resolved
// for a capability bounding set.
func (e *Engine) loadSeccompProfiles(caps []string) (map[string]*specs.LinuxSeccomp, error) {
	names, err := seccomp.Profiles(e.cfg.Paths.SeccompDir)
	if err != nil {
		return nil, fmt.Errorf("paths.seccomp_dir: %w", err)
	}
	out := map[string]*specs.LinuxSeccomp{}
	for _, n := range names {
		p, err := seccomp.Load(e.cfg.Paths.SeccompDir, n, caps, seccompRules(e.cfg.Sandbox.SeccompRules[n])...)
		if err != nil {
			return nil, fmt.Errorf("seccomp profile %s: %w", n, err)
		}
		out[n] = p
	}
	for n := range e.cfg.Sandbox.SeccompRules {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("sandbox.seccomp_rules.%s: no such profile in %s", n, e.cfg.Paths.SeccompDir)
		}
	}
	return out, nil
}

func seccompRules(rs []config.SeccompRule) []seccomp.Rule {
	out := make([]seccomp.Rule, len(rs))
	for i, r := range rs {
		out[i] = seccomp.Rule{Names: r.Names, Action: r.Action}
		if r.ErrnoRet != 0 {
			e := uint(r.ErrnoRet)
			out[i].ErrnoRet = &e
		}
	}
	return out
}

// Close stops background work. Sandboxes keep running; a restarted daemon
// adopts them.
func (e *Engine) Close() error {
	if e.snapshots != nil { // nil when Start was not reached
		e.snapshots.Stop()
	}
	if e.pipeline != nil {
		// Ephemeral run sandboxes still being terminated after their run
		// answered: let them go rather than leave them to the next
		// daemon's EndInterrupted.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		e.pipeline.WaitReleases(ctx)
		cancel()
	}
	if e.webhooks != nil { // nil when Start was not reached
		e.webhooks.Stop()
	}
	e.sandboxes.Close()
	if e.runtime != nil {
		e.runtime.Close() // after the manager: no start is under way
	}
	e.detachVMs()
	if e.net != nil {
		e.net.Close() // the network stays; a restarted daemon adopts it
	}
	e.tenants.Close() // writes the last-use times still pending
	err := e.disks.Close()
	e.diskStore.Close()
	if e.volumeDisks != nil {
		// Volumes stay mounted: sandboxes that outlive the daemon use them.
		e.volumeDisks.Close()
	}
	// The audit log before the database: its last checkpoint goes there.
	return errors.Join(err, e.audit.Close(), e.closeStores())
}

// Config returns the engine's configuration.
func (e *Engine) Config() *config.Config { return e.cfg }

// SeccompSupport reports whether seccomp can be enforced.
func (e *Engine) SeccompSupport() seccomp.Support { return e.seccomp }

// CreateSandboxRequest is the input of sandbox_create.
type CreateSandboxRequest = apitypes.CreateSandboxRequest

const mib = 1 << 20

// readyDisks is how many disks of the default geometry the storage pool
// keeps made, attached and mounted.
const readyDisks = 2

// Minimums below which a sandbox cannot even start its agent.
const (
	minMemory = 16 * mib
	minDisk   = 16 * mib
	minInodes = 1024
	minPids   = 16
)

// CreateSandbox validates req, applies defaults and caps, and starts a sandbox.
func (e *Engine) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*sandbox.Info, error) {
	return e.CreateSandboxProgress(ctx, req, nil)
}

// CreateSandboxProgress is CreateSandbox whose progress, if not nil, sees
// phase lines of a slow start (a VM's guest image built on first use, a
// disk guest booting).
func (e *Engine) CreateSandboxProgress(ctx context.Context, req CreateSandboxRequest, progress func(string)) (*sandbox.Info, error) {
	ctx, span := telemetry.StartOp(ctx, "sandbox.create", telemetry.KeyImage.String(cmp.Or(req.Image, req.Language)))
	info, err := e.createSandbox(ctx, req, progress)
	if info != nil {
		span.SetAttributes(telemetry.Sandbox(info.ID))
	}
	return info, telemetry.End(span, err)
}

func (e *Engine) createSandbox(ctx context.Context, req CreateSandboxRequest, progress func(string)) (*sandbox.Info, error) {
	if e.draining.Load() {
		// Gateways place no creates here; this refuses one from a gateway
		// whose view is older than the drain, or from a direct caller.
		return nil, errdefs.Unavailablef("node %q is draining: it takes no new sandboxes", e.cfg.Node.Name)
	}
	var tmpl *apitypes.TemplateCreateRequest
	if req.Template != "" {
		var err error
		if tmpl, err = e.applyTemplate(ctx, &req); err != nil {
			return nil, err
		}
	}
	if req.Backend == BackendVM {
		if len(req.Volumes) > 0 {
			return nil, errdefs.Invalidf("volumes: not available with backend vm (a VM has no host mounts)")
		}
		return e.createVM(ctx, req, progress)
	}
	if err := e.resolveContainerImage(ctx, &req, progress); err != nil {
		return nil, err
	}
	seed, err := e.snapshots.ForkSeed(ctx, &req)
	if err != nil {
		return nil, err
	}
	spec, err := e.sandboxSpec(req)
	if err != nil {
		return nil, err
	}
	if seed != nil {
		if err := e.snapshots.SeedSpec(spec, seed); err != nil {
			return nil, err
		}
	}
	// The volumes count as in use from here until the sandbox is live
	// (its spec names them) or failed: a delete meanwhile is refused.
	vols, releaseVols, err := e.volumes.Acquire(ctx, req.Volumes)
	if err != nil {
		return nil, err
	}
	defer releaseVols()
	spec.Volumes = vols
	if tmpl != nil {
		spec.Template = tmpl.Name
	}
	if req.RequestID != "" {
		// Creates with a request id run one at a time, so that two
		// retries racing each other cannot both start a sandbox.
		e.requestMu.Lock()
		defer e.requestMu.Unlock()
		if info, err := e.sandboxByRequestID(ctx, req.RequestID); info != nil || err != nil {
			return info, err
		}
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[RequestIDLabel] = req.RequestID
	}
	if e.cfg.Sandbox.SeccompProfile != seccomp.Unconfined && !e.seccomp.OK() {
		e.metrics.created.WithLabelValues("rejected").Inc()
		return nil, errdefs.Unavailablef("seccomp cannot be enforced (%s); refusing to start sandboxes unless sandbox.seccomp_profile is \"unconfined\"", e.seccomp.Reason)
	}
	// A pinned digest is that build or nothing: building the recipe anew
	// would not bring it back (the manager says it is gone).
	if spec.ImageDigest == "" {
		if err := e.ensureImageOnDemand(ctx, spec.Image); err != nil {
			e.metrics.created.WithLabelValues("failed").Inc()
			return nil, err
		}
	}
	if seed != nil {
		// A fork: its archive must stay until the sandbox has started.
		unlock, err := e.snapshots.Hold(ctx, seed.ID, "from_snapshot")
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	return e.startSandbox(ctx, spec, tmpl)
}

// resolveContainerImage checks a container create's backend and OS, and
// turns a registry reference into the image it was pulled as, pulling it
// now if images.allow_pull lets it, under the caller's pull rules. It is
// the one resolution of a create's image: sandbox_create's and
// template_create's.
func (e *Engine) resolveContainerImage(ctx context.Context, req *CreateSandboxRequest, progress func(string)) error {
	switch req.Backend {
	case "", BackendContainer:
	default:
		return errdefs.Invalidf("backend: must be %s or %s, got %q", BackendContainer, BackendVM, req.Backend)
	}
	if req.OS != "" {
		return errdefs.Invalidf("os: only with backend vm (a container runs Linux)")
	}
	if !oci.IsReference(req.Image) {
		return nil
	}
	name, err := e.imgs.Resolve(ctx, "image", req.Image, progressLines(progress))
	if err != nil {
		return err
	}
	if req.Language == req.Image {
		// A template's request names its image as its language too.
		req.Language = name
	}
	req.Image = name
	return nil
}

// startSandbox starts the sandbox of spec and, for a template, waits for
// its start command to be ready; the create metrics count the outcome.
func (e *Engine) startSandbox(ctx context.Context, spec *sandbox.Spec, tmpl *apitypes.TemplateCreateRequest) (*sandbox.Info, error) {
	start := time.Now()
	info, err := e.sandboxes.Create(ctx, *spec)
	if err == nil && tmpl != nil {
		// The start command ready before the sandbox is handed out (at
		// once for a warm one of the template's pool).
		if rerr := e.readyTemplate(ctx, info.ID, tmpl); rerr != nil {
			if _, terr := e.sandboxes.Terminate(context.WithoutCancel(ctx), info.ID, "template start command not ready: "+rerr.Error()); terr != nil {
				e.log.Error("terminate a template sandbox that did not get ready", "sandbox", info.ID, "err", terr)
			}
			info, err = nil, rerr
		}
	}
	switch {
	case err == nil:
		e.metrics.created.WithLabelValues("ready").Inc()
		e.metrics.createTime.Observe(time.Since(start).Seconds())
	case errdefs.CodeOf(err) == errdefs.Internal:
		e.metrics.created.WithLabelValues("failed").Inc()
	default:
		e.metrics.created.WithLabelValues("rejected").Inc()
	}
	return info, err
}

func (e *Engine) sandboxSpec(req CreateSandboxRequest) (*sandbox.Spec, error) {
	spec, err := e.specImage(req)
	if err != nil {
		return nil, err
	}
	// In this order, so that a request wrong in several fields is told
	// about the same one first as ever.
	for _, step := range []func(*sandbox.Spec, CreateSandboxRequest) error{e.specRoot, e.specLimits, e.specSeccomp, e.specNetwork, e.specChecks} {
		if err := step(spec, req); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// specImage resolves the request's image and language and starts the spec
// with the configured default limits.
func (e *Engine) specImage(req CreateSandboxRequest) (*sandbox.Spec, error) {
	sc := e.cfg.Sandbox
	imageName := req.Image
	if imageName == "" {
		imageName = req.Language
	}
	if imageName == "" {
		return nil, errdefs.Invalidf("language: required (one of %s)", strings.Join(e.knownImages(), ", "))
	}
	if !e.imageKnown(imageName) {
		field := "image"
		if req.Image == "" {
			field = "language"
		}
		return nil, errdefs.Invalidf("%s: unknown image %q (known: %s)", field, imageName, strings.Join(e.knownImages(), ", "))
	}
	lang := req.Language
	if lang == "" {
		lang = imageName
	}
	spec := &sandbox.Spec{
		Language: lang, Image: imageName, UID: sc.User,
		Limits: sandbox.Limits{
			MemoryBytes: int64(sc.Memory), CPUs: sc.CPUs, Pids: sc.Pids, DiskBytes: int64(sc.Disk),
		},
		Env: req.Env, Labels: req.Labels, ImageDigest: req.ImageDigest,
	}
	img, err := e.images.Get(imageName)
	if req.ImageDigest != "" {
		img, err = e.images.GetDigest(imageName, req.ImageDigest)
	}
	if err == nil && img.OCI != nil {
		// An OCI image's config says who commands run as and where. Its
		// root user stays the unprivileged sandbox user: root inside
		// is what root mode asks for, not what an image may.
		spec.WorkDir = img.OCI.WorkingDir
		if img.User.UID != 0 {
			spec.UID = img.User.UID
		}
	}
	return spec, nil
}

// specRoot applies root mode.
func (e *Engine) specRoot(spec *sandbox.Spec, req CreateSandboxRequest) error {
	sc := e.cfg.Sandbox
	if req.Root {
		// Root inside is root on the host without a user namespace.
		if sc.UsernsPool.Count == 0 {
			return errdefs.New(errdefs.InvalidArgument, "root: root mode needs user namespaces, which this server runs without (sandbox.userns_pool.count is 0)")
		}
		spec.UID, spec.Root = 0, true
		if req.RootAsUser {
			spec.UID = sc.User
		}
	}
	return nil
}

// specLimits applies the requested memory, disk, inodes, disk backing,
// pids and CPUs within their caps.
func (e *Engine) specLimits(spec *sandbox.Spec, req CreateSandboxRequest) error {
	sc := e.cfg.Sandbox
	var err error
	if req.MemoryMB != nil {
		if spec.Limits.MemoryBytes, err = megabytes("memory_mb", *req.MemoryMB, minMemory, int64(sc.MaxMemory)); err != nil {
			return err
		}
	}
	if req.DiskMB != nil {
		if spec.Limits.DiskBytes, err = megabytes("disk_mb", *req.DiskMB, minDisk, int64(sc.MaxDisk)); err != nil {
			return err
		}
	}
	spec.Limits.Inodes = storage.DefaultInodes(spec.Limits.DiskBytes)
	if req.Inodes != nil {
		// ext4 cannot have more than one inode per KiB.
		if err := checkRange("inodes", *req.Inodes, minInodes, spec.Limits.DiskBytes/1024, 1); err != nil {
			return err
		}
		spec.Limits.Inodes = *req.Inodes
	}
	switch spec.DiskBacking = req.DiskBacking; spec.DiskBacking {
	case "":
		spec.DiskBacking = sc.DiskBacking
	case storage.BackingDisk, storage.BackingMemory:
	default:
		return errdefs.Invalidf("disk_backing: must be %q or %q, got %q", storage.BackingDisk, storage.BackingMemory, req.DiskBacking)
	}
	if req.Pids != nil {
		if err := checkRange("pids", *req.Pids, minPids, sc.MaxPids, 1); err != nil {
			return err
		}
		spec.Limits.Pids = *req.Pids
	}
	if req.CPUs != nil {
		c := *req.CPUs
		if !(c >= 0.01) { // also rejects NaN
			return errdefs.Invalidf("cpus: must be at least 0.01, got %v", c)
		}
		if c > sc.MaxCPUs {
			return errdefs.Invalidf("cpus: %v exceeds the maximum %v", c, sc.MaxCPUs)
		}
		spec.Limits.CPUs = c
	}
	return nil
}

// specSeccomp applies a seccomp profile chosen by name.
func (e *Engine) specSeccomp(spec *sandbox.Spec, req CreateSandboxRequest) error {
	if req.SeccompProfile != "" {
		if _, ok := e.seccompProfiles[req.SeccompProfile]; !ok {
			return errdefs.Invalidf("seccomp_profile: unknown profile %q (known: %s)", req.SeccompProfile, strings.Join(slices.Sorted(maps.Keys(e.seccompProfiles)), ", "))
		}
		spec.SeccompProfile = req.SeccompProfile
	}
	return nil
}

// specNetwork applies the network mode, its limits, allowlist and credentials.
func (e *Engine) specNetwork(spec *sandbox.Spec, req CreateSandboxRequest) error {
	if len(req.Allow) > 0 && req.Network != NetworkAllowlist {
		return errdefs.Invalidf("allow: only valid with network %q", NetworkAllowlist)
	}
	var err error
	if spec.Network, err = e.networkMode("network", req.Network); err != nil {
		return err
	}
	if err := e.networkLimits(spec, req); err != nil {
		return err
	}
	if len(req.Credentials) > 0 && spec.Network == NetworkNone {
		return errdefs.Invalidf("credentials: only valid with network egress or allowlist (the credential proxy is on the gateway)")
	}
	if spec.Network != NetworkNone {
		if err := e.net.Validate(networkRequest(spec.Network, req.Allow, req.Credentials, spec.Limits)); err != nil {
			return err
		}
		spec.Allow, spec.Credentials = req.Allow, req.Credentials
		spec.Env = withPackageIndexes(spec.Env, e.netCfg.PackageIndexes.Env())
	}
	return nil
}

// specChecks applies the TTL and checks env, labels and the request id.
func (e *Engine) specChecks(spec *sandbox.Spec, req CreateSandboxRequest) error {
	sc := e.cfg.Sandbox
	if req.TTLSeconds != nil {
		var err error
		if spec.TTL, err = wholeSeconds("ttl_seconds", *req.TTLSeconds, sc.MaxLifetime.D()); err != nil {
			return err
		}
	}
	spec.PauseOnExpiry = req.PauseOnExpiry && spec.TTL > 0
	if err := checkEnv("env", req.Env); err != nil {
		return err
	}
	if err := checkLabels(req.Labels); err != nil {
		return err
	}
	if _, ok := req.Labels[RequestIDLabel]; ok {
		return errdefs.Invalidf("labels.%s: reserved; use request_id", RequestIDLabel)
	}
	if req.RequestID != "" && !requestIDRe.MatchString(req.RequestID) {
		return errdefs.Invalidf("request_id: %q is not 1 to 128 letters, digits and ._:- (starting with a letter or digit)", req.RequestID)
	}
	return nil
}

// RequestIDLabel is the label that records a create's request_id.
const RequestIDLabel = "sandboxd.request_id"

var requestIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// sandboxByRequestID finds the sandbox an earlier create with request id
// rid made, in any state (terminated ones until retention drops them).
func (e *Engine) sandboxByRequestID(ctx context.Context, rid string) (*sandbox.Info, error) {
	all, err := e.ListSandboxes(ctx, "all")
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		if sb.Labels[RequestIDLabel] == rid {
			return sb, nil
		}
	}
	return nil, nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > 64 {
		return errdefs.Invalidf("labels: at most 64 labels")
	}
	for k, v := range labels {
		if k == "" || len(k) > 128 || strings.ContainsRune(k, 0) {
			return errdefs.Invalidf("labels: invalid key %q", k)
		}
		if len(v) > 1024 || strings.ContainsRune(v, 0) {
			return errdefs.Invalidf("labels.%s: value contains NUL or exceeds 1024 bytes", k)
		}
	}
	return nil
}

// SandboxDetail is a sandbox with its live usage (sandbox_get).
type SandboxDetail = apitypes.SandboxDetail

// GetSandbox describes a sandbox; live ones include their usage.
func (e *Engine) GetSandbox(ctx context.Context, id string) (*SandboxDetail, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	e.describeVM(ctx, info, true)
	d := &SandboxDetail{Sandbox: *info}
	if info.State.Live() && e.net != nil && info.Network != "" && info.Network != NetworkNone {
		if st, err := e.networkStatus(id); err == nil {
			d.NetworkStatus = st
		}
		for name, u := range e.net.CredentialUsage(id) {
			if d.CredentialUsage == nil {
				d.CredentialUsage = map[string]apitypes.CredentialUsage{}
			}
			d.CredentialUsage[name] = apitypes.CredentialUsage(u)
		}
	}
	if info.State.Live() && info.State != sandbox.StateCreating {
		if u, err := e.sandboxes.Usage(ctx, id); err == nil {
			d.Usage = u
		}
	}
	return d, nil
}

// ListSandboxes lists sandboxes in state (all live ones when empty; "all" for
// every state).
func (e *Engine) ListSandboxes(ctx context.Context, state string) ([]*sandbox.Info, error) {
	var l []*sandbox.Info
	var err error
	switch {
	case state == "":
		l, err = e.sandboxes.List(ctx)
	case state == "all":
		l, err = e.sandboxes.List(ctx, sandbox.StateCreating, sandbox.StateReady, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateTerminated, sandbox.StateFailed)
	case sandbox.State(state).Valid():
		l, err = e.sandboxes.List(ctx, sandbox.State(state))
	default:
		return nil, errdefs.Invalidf("state: must be one of creating, ready, running, terminated, failed, all; got %q", state)
	}
	for _, info := range l {
		if info.Backend == BackendVM {
			// The OS only: a listing asks no VM's handle.
			info.VM = &apitypes.VMInfo{OS: vmOS(info)}
		}
	}
	return l, err
}

// TerminateSandbox stops a sandbox and removes every trace of it.
func (e *Engine) TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Terminate(ctx, id, "terminated by request")
	if err == nil {
		e.describeVM(ctx, info, false)
	}
	return info, err
}

// PauseSandbox freezes every process of a sandbox (state paused; see
// sandbox.Manager.Pause).
func (e *Engine) PauseSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	return e.sandboxes.Pause(ctx, id)
}

// SetSandboxTimeout makes sandbox id expire seconds from now, earlier or
// later than before, within sandbox.max_lifetime counted from its creation.
func (e *Engine) SetSandboxTimeout(ctx context.Context, id string, seconds int64) (*sandbox.Info, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	d, err := wholeSeconds("timeout", seconds, e.cfg.Sandbox.MaxLifetime.D())
	if err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.sandboxes.SetTTL(ctx, id, time.Since(info.CreatedAt)+d)
}

// ResumeSandbox thaws a paused sandbox.
func (e *Engine) ResumeSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	return e.sandboxes.Resume(ctx, id)
}

func checkSandboxID(id string) error { return sandbox.CheckID(id) }

// TerminateLabeled terminates every live sandbox whose label key has value
// (an MCP session's sandboxes when it ends) and returns their ids.
func (e *Engine) TerminateLabeled(ctx context.Context, key, value, reason string) ([]string, error) {
	live, err := e.sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, sb := range live {
		if sb.Labels[key] != value {
			continue
		}
		if _, err := e.sandboxes.Terminate(ctx, sb.ID, reason); err != nil && errdefs.CodeOf(err) != errdefs.NotFound {
			errs = append(errs, fmt.Errorf("terminate %s: %w", sb.ID, err))
			continue
		}
		done = append(done, sb.ID)
	}
	return done, errors.Join(errs...)
}
