// Package config holds mcp-sandboxd's configuration: the typed structure, its
// documented defaults, YAML loading with key-path errors, SANDBOXD_*
// environment overrides and validation.
//
// A configuration is built in three layers, each overriding the one before:
// Default(), then the YAML file, then the environment. Every problem found on
// the way is reported at once, each naming the full key path
// ("sandbox.memory", "network.deny[2]"), in a *ValidationError.
//
// config/mcp-sandboxd.yaml in the repository is DefaultYAML verbatim; a test
// keeps the two, and Default(), from drifting apart.
package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// DefaultPath is where the daemon looks for its configuration file.
const DefaultPath = "/etc/mcp-sandboxd/mcp-sandboxd.yaml"

// ToolGroups are the MCP tool groups server.tools may name, in the order the
// default configuration lists them.
var ToolGroups = []string{"sandbox", "exec", "files", "run", "images", "autofix", "vm"}

// Config is the whole configuration file.
type Config struct {
	Server  Server  `yaml:"server"`
	Paths   Paths   `yaml:"paths"`
	Sandbox Sandbox `yaml:"sandbox"`
	Network Network `yaml:"network"`
	Images  Images  `yaml:"images"`
	Runs    Runs    `yaml:"runs"`
	// Snapshots: workspace snapshots (docs/storage.md).
	Snapshots Snapshots `yaml:"snapshots"`
	// Volumes: named volumes, disk that outlives sandboxes (docs/storage.md).
	Volumes Volumes `yaml:"volumes"`
	// Webhooks: lifecycle webhooks (pkg/services/webhooks, docs/webhooks.md).
	Webhooks Webhooks `yaml:"webhooks"`
	Autofix  Autofix  `yaml:"autofix"`
	VM       VM       `yaml:"vm"`
	// E2B: the E2B-compatible API (pkg/e2b, docs/e2b.md).
	E2B E2B `yaml:"e2b"`
	// Audit: the tamper-evident audit log (pkg/audit).
	Audit Audit `yaml:"audit"`
	// SSH: the SSH endpoint (pkg/sshd, README "SSH access").
	SSH SSH `yaml:"ssh"`
	// Store: where the fleet's shared state lives (pkg/store/pgstore).
	Store Store `yaml:"store"`
	// Node: this daemon as one node of a fleet behind gateways.
	Node Node `yaml:"node"`
	// Gateway: the settings of `mcp-sandboxd gateway` (pkg/gateway).
	Gateway Gateway `yaml:"gateway"`
	Log     Log     `yaml:"log"`
	// Telemetry: OpenTelemetry traces exported over OTLP (pkg/telemetry).
	Telemetry Telemetry `yaml:"telemetry"`
}

// Store is the `store` section. The daemon's own state is always the
// SQLite file in paths.state_dir; PostgresURL moves what several
// daemons and gateways must share — the API keys — into one PostgreSQL
// database.
type Store struct {
	// PostgresURL is a postgres:// URL (empty: the keys stay in the
	// SQLite state database). Keep the password out of it: libpq's
	// PGPASSWORD or ~/.pgpass are read.
	PostgresURL string `yaml:"postgres_url"`
}

// Node is the `node` section: a daemon's identity in a fleet.
type Node struct {
	// Name is this node's name in the fleet (its gateways' node list, its
	// Kubernetes node name). Non-empty, it is written into every new
	// sandbox id (pkg/sandbox.NodeTag) so that a gateway routes by id
	// without a lookup. Empty: a lone daemon, ids as before.
	Name string `yaml:"name"`
	// GatewaySecretFile holds the secret gateways present when they
	// forward a caller they authenticated; only a request carrying it may
	// name its principal. Empty: no gateway is trusted.
	GatewaySecretFile string `yaml:"gateway_secret_file"`
}

// Gateway is the `gateway` section, read only by `mcp-sandboxd gateway`.
type Gateway struct {
	// Listen is the gateway's TCP address (host:port).
	Listen string `yaml:"listen"`
	// Nodes is the static node list (hosts without Kubernetes).
	Nodes []GatewayNode `yaml:"nodes"`
	// SecretFile holds the secret shared with the nodes'
	// node.gateway_secret_file; it also authenticates the gateway to the
	// nodes' admin routes.
	SecretFile string `yaml:"secret_file"`
	// AuthTokenFile is the admin key callers present to the gateway (the
	// first key of the fleet's tenants store).
	AuthTokenFile string `yaml:"auth_token_file"`
	// StateDB is the tenants store the gateways share (SQLite path here;
	// the fleet's shared database with the pgx driver).
	StateDB string `yaml:"state_db"`
	// NodeTimeout bounds a gateway's calls that ask every node (lists,
	// capacity); a node slower than this counts as gone for that call.
	NodeTimeout Duration `yaml:"node_timeout"`
	// Kubernetes finds the nodes through the Kubernetes API
	// (pkg/kubediscovery) instead of Nodes: the EndpointSlices of the node
	// daemons' headless Service. Service empty: the static list.
	Kubernetes GatewayKubernetes `yaml:"kubernetes"`
	// ProbeInterval is how long placements reuse the nodes' capacity
	// before asking them again (each gateway counts its own placements
	// in between); a drain through another gateway is seen within it.
	ProbeInterval Duration `yaml:"probe_interval"`
	// ReconcileInterval is how often a gateway with store.postgres_url
	// releases the fleet-quota reservations of sandboxes that ended on
	// their nodes (expired, terminated elsewhere); 0: 10s.
	ReconcileInterval Duration `yaml:"reconcile_interval"`
	// E2BListen, when set, serves the E2B API (control plane and envd) on
	// this address, routed to the nodes' e2b listeners; E2BDomain is its
	// host-name routing domain ({port}-{id}.{domain}), as e2b.domain.
	E2BListen string `yaml:"e2b_listen"`
	E2BDomain string `yaml:"e2b_domain"`
	// PreviewListen, when set, serves preview URLs ({id}-{port} host
	// names, as server.preview_listen) routed to the nodes' preview
	// listeners.
	PreviewListen string `yaml:"preview_listen"`
	// PreviewURL is the address callers reach preview_listen at (a load
	// balancer's, https://preview.example.com); exposures made through the
	// gateway name it. Empty: the listener's own address.
	PreviewURL string `yaml:"preview_url"`
}

// GatewayKubernetes is gateway.kubernetes: where the node daemons'
// headless Service is (the Helm chart sets it).
type GatewayKubernetes struct {
	Namespace string `yaml:"namespace"` // the Service's namespace
	Service   string `yaml:"service"`   // its name; empty: discovery off
	PortName  string `yaml:"port_name"` // the port of the daemons' REST API
}

// GatewayNode is one node of gateway.nodes.
type GatewayNode struct {
	Name string `yaml:"name"` // node.name of that daemon
	URL  string `yaml:"url"`  // its server.http_addr as http://host:port
}

// Server is the `server` section.
type Server struct {
	Socket string `yaml:"socket"` // REST API unix socket
	// SocketGroup owns the socket (read-write for it under SocketMode):
	// its members may use the daemon without root. Empty: root's group.
	SocketGroup string `yaml:"socket_group"`
	// SocketMode is the socket's permission bits, octal ("0660").
	SocketMode    string   `yaml:"socket_mode"`
	HTTPAddr      string   `yaml:"http_addr"`       // REST, MCP (/mcp), health, metrics; empty: no TCP listener
	AuthTokenFile string   `yaml:"auth_token_file"` // bearer token for HTTP (all but /healthz)
	Tools         []string `yaml:"tools"`           // enabled MCP tool groups, from ToolGroups
	// MCPMaxResultBytes caps one MCP tool result as a client hands it to its
	// model (the structured content or its JSON text block, and the
	// summary); longer output is cut with a marker saying where the rest is.
	MCPMaxResultBytes ByteSize `yaml:"mcp_max_result_bytes"`
	// MCPOnSessionEnd is what happens to the sandboxes an MCP session
	// created when the session ends: keep or terminate.
	MCPOnSessionEnd string `yaml:"mcp_on_session_end"`
	// MCPProgressInterval is how long an MCP tool call may stay silent
	// before the client is told it still runs (a progress notification
	// with a progress token, an SSE comment over HTTP without one).
	MCPProgressInterval Duration `yaml:"mcp_progress_interval"`
	// MaxRequestBytes caps every request body, /mcp included; larger files
	// go through the REST upload (PUT .../files), capped on its own.
	MaxRequestBytes ByteSize `yaml:"max_request_bytes"`

	// PreviewListen is the TCP address (host:port) of the preview listener,
	// which serves sandboxes' exposed ports (pkg/preview); port 0 picks a
	// free one. Empty: no preview listener.
	PreviewListen string `yaml:"preview_listen"`
}

// SocketPerm is server.socket_mode as file permission bits.
func (s Server) SocketPerm() os.FileMode {
	m, err := strconv.ParseUint(s.SocketMode, 8, 32)
	if err != nil || s.SocketMode == "" {
		return 0o660
	}
	return os.FileMode(m) & os.ModePerm
}

// What server.mcp_on_session_end may say.
const (
	SessionEndKeep      = "keep"
	SessionEndTerminate = "terminate"
)

// Paths is the `paths` section.
type Paths struct {
	StateDir   string `yaml:"state_dir"`   // SQLite, images, runs (persistent)
	RunDir     string `yaml:"run_dir"`     // libcontainer state, sandbox mounts, lock (tmpfs)
	RecipesDir string `yaml:"recipes_dir"` // rootfs recipes
	SeccompDir string `yaml:"seccomp_dir"` // seccomp profiles
	AgentPath  string `yaml:"agent_path"`  // the static sandbox-agent binary
	ImagesDir  string `yaml:"images_dir"`  // built images; empty: state_dir/images
	// SandboxesDir holds the ext4 image files of disk-backed sandboxes;
	// empty: state_dir/sandboxes.
	SandboxesDir string `yaml:"sandboxes_dir"`
}

// SandboxesDirOrDefault is paths.sandboxes_dir, or state_dir/sandboxes when
// it is empty.
func (p Paths) SandboxesDirOrDefault() string {
	if p.SandboxesDir != "" {
		return p.SandboxesDir
	}
	return filepath.Join(p.StateDir, "sandboxes")
}

// Sandbox is the `sandbox` section: defaults and caps for sandbox limits.
type Sandbox struct {
	Memory         ByteSize `yaml:"memory"`           // default memory limit (no swap)
	MaxMemory      ByteSize `yaml:"max_memory"`       // cap on a requested memory limit
	CPUs           float64  `yaml:"cpus"`             // default CPU quota in cores
	MaxCPUs        float64  `yaml:"max_cpus"`         // cap
	Pids           int64    `yaml:"pids"`             // default pids limit
	MaxPids        int64    `yaml:"max_pids"`         // cap
	Disk           ByteSize `yaml:"disk"`             // default writable-layer size
	MaxDisk        ByteSize `yaml:"max_disk"`         // cap
	DiskBacking    string   `yaml:"disk_backing"`     // disk (ext4 image) | memory (tmpfs)
	ExecTimeout    Duration `yaml:"exec_timeout"`     // default per-command timeout
	MaxExecTimeout Duration `yaml:"max_exec_timeout"` // cap
	IdleTimeout    Duration `yaml:"idle_timeout"`     // terminate after this long ready and unused (0: never)
	MaxLifetime    Duration `yaml:"max_lifetime"`     // terminate after this long in any state (0: never)
	MaxSandboxes   int      `yaml:"max_sandboxes"`    // live (not terminated) sandboxes at once
	OutputLimit    ByteSize `yaml:"output_limit"`     // per stream, per command
	User           int      `yaml:"user"`             // uid (and gid) commands run as
	SeccompProfile string   `yaml:"seccomp_profile"`  // profile name in seccomp_dir, or "unconfined"
	// SeccompRules are added to the named profiles without copying them
	// (profile name → rules); a rule replaces every rule of the profile for
	// the syscalls it names.
	SeccompRules map[string][]SeccompRule `yaml:"seccomp_rules"`
	// SeccompDiagnostics reports each command's refused syscalls by name.
	SeccompDiagnostics bool `yaml:"seccomp_diagnostics"`
	// Landlock confines each container sandbox's agent and commands to
	// the paths its spec declares (pkg/landlock): auto (where the kernel
	// can), require (the daemon refuses to start without it) or off.
	Landlock     string         `yaml:"landlock"`
	Pool         map[string]int `yaml:"pool"`          // warm sandboxes per language
	CgroupParent string         `yaml:"cgroup_parent"` // absolute cgroup path of the daemon's parent
	IOReadBPS    ByteSize       `yaml:"io_read_bps"`   // block I/O read throttle per sandbox, bytes/s (0: none)
	IOWriteBPS   ByteSize       `yaml:"io_write_bps"`  // block I/O write throttle per sandbox, bytes/s (0: none)
	// CgroupFavorDynMods lets the daemon set favordynmods on the host's
	// cgroup2 hierarchy at start (see cgroups.FavorDynMods): every command
	// enters a cgroup of its own, and without it each such move can wait
	// for an RCU grace period.
	CgroupFavorDynMods bool `yaml:"cgroup_favordynmods"`
	// UsernsPool is where each sandbox's own range of host ids comes from.
	UsernsPool UsernsPool `yaml:"userns_pool"`
}

// UsernsPool is the host id space sandbox user namespaces are cut from:
// Count ranges of Size ids from Base; range n is Base+n*Size ... Count 0
// runs sandboxes without a user namespace (as host root and uid User).
type UsernsPool struct {
	Base  int64 `yaml:"base"`  // first host uid/gid of the pool
	Size  int64 `yaml:"size"`  // ids per sandbox
	Count int64 `yaml:"count"` // ranges (sandboxes at once); 0: no user namespaces
}

// SeccompRule gives the named syscalls an action (SCMP_ACT_ALLOW,
// SCMP_ACT_ERRNO with errno_ret, SCMP_ACT_KILL_PROCESS, SCMP_ACT_LOG).
type SeccompRule struct {
	Names    []string `yaml:"names"`
	Action   string   `yaml:"action"`
	ErrnoRet int      `yaml:"errno_ret"` // 0: EPERM
}

// Network is the `network` section.
type Network struct {
	Bridge      string   `yaml:"bridge"`       // bridge device sandboxes with network access attach to
	Subnet      string   `yaml:"subnet"`       // IPv4 CIDR of sandbox addresses
	DefaultMode string   `yaml:"default_mode"` // none | egress | allowlist
	Deny        []string `yaml:"deny"`         // CIDRs always refused
	DNS         []string `yaml:"dns"`          // resolver addresses; empty: the host's
	MTU         int      `yaml:"mtu"`          // of the bridge and veths; 0: the kernel's default
	// Bandwidth is a sandbox's default rate in bytes per second in each
	// direction (0: unlimited); MaxBandwidth caps what a sandbox may ask.
	Bandwidth    ByteSize `yaml:"bandwidth"`
	MaxBandwidth ByteSize `yaml:"max_bandwidth"`
	// ConnRate is a sandbox's default limit of new connections per second
	// (0: unlimited); MaxConnRate caps what a sandbox may ask.
	ConnRate    int `yaml:"conn_rate"`
	MaxConnRate int `yaml:"max_conn_rate"`
	// Presets are named allowlists, used as "@name" in a sandbox's allow.
	Presets        map[string][]string `yaml:"presets"`
	PackageIndexes PackageIndexes      `yaml:"package_indexes"`
	// Credentials are upstream APIs whose secrets the daemon adds at the
	// egress (the credential proxy on the gateway), by name; sandboxes
	// are granted them with `credentials` on create. CredentialPort is the
	// proxy's TCP port on the gateway.
	Credentials    map[string]Credential `yaml:"credentials"`
	CredentialPort int                   `yaml:"credential_port"`
	// ApprovalHold is how long the DNS forwarder holds an allowlist
	// sandbox's lookup of a refused name while the MCP client running
	// the call is asked whether to allow it (network approvals).
	ApprovalHold Duration `yaml:"approval_hold"`
}

// Credential is one `network.credentials.NAME`.
type Credential struct {
	BaseURL      string `yaml:"base_url"`      // upstream URL (https:// in production)
	Header       string `yaml:"header"`        // header the proxy sets, e.g. x-api-key
	HeaderPrefix string `yaml:"header_prefix"` // before the secret, e.g. "Bearer "
	SecretEnv    string `yaml:"secret_env"`    // the daemon's environment variable holding the secret
	SecretFile   string `yaml:"secret_file"`   // or a file of the daemon's (read per request)
	BaseURLEnv   string `yaml:"base_url_env"`  // sandbox variable set to the proxy's URL
	KeyEnv       string `yaml:"key_env"`       // sandbox variable set to a dummy key
	MaxRequests  int64  `yaml:"max_requests"`  // per sandbox; 0: no cap
	MaxTokens    int64  `yaml:"max_tokens"`    // per sandbox, input+output; 0: no cap
}

// PackageIndexes is `network.package_indexes`: where sandboxes install
// packages from, passed as the package managers' environment variables.
// Empty: the managers' own defaults.
type PackageIndexes struct {
	PipIndexURL string `yaml:"pip_index_url"` // PIP_INDEX_URL
	NpmRegistry string `yaml:"npm_registry"`  // NPM_CONFIG_REGISTRY
	GoProxy     string `yaml:"go_proxy"`      // GOPROXY
}

// Images is the `images` section.
type Images struct {
	Mirror    string   `yaml:"mirror"`    // Debian mirror; empty: the host's apt sources
	Suite     string   `yaml:"suite"`     // default suite for recipes that name none
	Languages []string `yaml:"languages"` // enabled recipes; empty: all
	// BuildOnDemand builds an image that is not built yet when a sandbox
	// or run first asks for it; false: such requests fail as unavailable.
	BuildOnDemand bool `yaml:"build_on_demand"`
	// PruneStale removes images of an older digest of a recipe that no
	// sandbox of this daemon uses, at start and after each build.
	PruneStale bool `yaml:"prune_stale"`
	// AllowPull lists the registries (host[:port]) a sandbox_create may
	// pull an image reference from on first use; "*" allows any. Empty:
	// images are pulled only by an explicit image_pull.
	AllowPull []string `yaml:"allow_pull"`
	// MaxSize caps an OCI image's unpacked layers (a decompression bomb
	// stops there); MaxManifestSize its manifest, index and config.
	MaxSize         ByteSize `yaml:"max_size"`
	MaxManifestSize ByteSize `yaml:"max_manifest_size"`
	// Registries are the credentials and CAs of registries images are
	// pulled from; DockerConfig a Docker config.json read for registries
	// not listed (its "auths").
	Registries   []Registry `yaml:"registries"`
	DockerConfig string     `yaml:"docker_config"`
	// PrivateRegistries lists the registries (host or host:port) a
	// non-admin key may pull from although they resolve to a non-public
	// address (private, loopback, link-local, CGNAT, ...); those of
	// Registries may be too. Every other pull of a non-admin key connects
	// only to public addresses.
	PrivateRegistries []string `yaml:"private_registries"`
}

// Registry is one registry's credentials and CA.
type Registry struct {
	Host     string `yaml:"host"` // host[:port] as image references name it
	Username string `yaml:"username"`
	// Password, or PasswordEnv naming the daemon's variable holding it
	// (kept out of the configuration file).
	Password    string `yaml:"password"`
	PasswordEnv string `yaml:"password_env"`
	// Token is an identity (refresh) token, instead of a password.
	Token string `yaml:"token"`
	// CAFile is a PEM file of the CA the registry's certificate chains to,
	// when not one of the system's.
	CAFile string `yaml:"ca_file"`
}

// Runs is the `runs` section: run records (docs/SPEC.md "Run records").
type Runs struct {
	Dir          string   `yaml:"dir"`            // where records go; empty: state_dir/runs
	MaxAge       Duration `yaml:"max_age"`        // delete records older than this (0: never)
	MaxTotalSize ByteSize `yaml:"max_total_size"` // delete the oldest records beyond this total (0: no limit)
	LogCap       ByteSize `yaml:"log_cap"`        // bytes kept per stream in stdout.log / stderr.log
}

// Snapshots is the `snapshots` section: workspace snapshots.
type Snapshots struct {
	Dir     string   `yaml:"dir"`      // where archives go; empty: state_dir/snapshots
	MaxAge  Duration `yaml:"max_age"`  // delete snapshots older than this (0: never)
	MaxSize ByteSize `yaml:"max_size"` // cap on one snapshot's compressed archive (0: none)
}

// Volumes is the `volumes` section: named volumes.
type Volumes struct {
	Dir         string   `yaml:"dir"`          // where volume images go; empty: state_dir/volumes
	DefaultSize ByteSize `yaml:"default_size"` // size of a volume created without size_mb
	MaxSize     ByteSize `yaml:"max_size"`     // cap on one volume's size
	MaxVolumes  int      `yaml:"max_volumes"`  // volumes at once (0: no cap)
	// MaxPerSandbox caps the volumes one sandbox mounts.
	MaxPerSandbox int `yaml:"max_per_sandbox"`
}

// DirOrDefault is volumes.dir, or state_dir/volumes when it is empty.
func (v Volumes) DirOrDefault(stateDir string) string {
	if v.Dir != "" {
		return v.Dir
	}
	return filepath.Join(stateDir, "volumes")
}

// Webhooks is the `webhooks` section: lifecycle webhooks
// (docs/webhooks.md).
type Webhooks struct {
	// AllowPrivate lists the networks (CIDRs) of private, loopback and
	// link-local addresses any caller's webhook may be delivered to. An
	// address of those kinds outside them needs the administrator: a hook
	// an admin key registers may reach one.
	AllowPrivate []string `yaml:"allow_private"`
	// RetryBase is the first retry's delay; each further one doubles it,
	// up to RetryMax, with jitter.
	RetryBase Duration `yaml:"retry_base"`
	RetryMax  Duration `yaml:"retry_max"`
	// MaxAttempts is how many times one delivery is tried before it is
	// given up (state failed; it can be redelivered).
	MaxAttempts int `yaml:"max_attempts"`
	// DisableAfter is how many attempts in a row may fail before the
	// webhook is disabled.
	DisableAfter int `yaml:"disable_after"`
	// MaxAge: deliveries older than this leave the delivery log.
	MaxAge Duration `yaml:"max_age"`
	// MaxWebhooks caps the webhooks of one tenant.
	MaxWebhooks int `yaml:"max_webhooks"`
}

// Autofix is the `autofix` section.
type Autofix struct {
	Provider       string   `yaml:"provider"`        // client | sampling | anthropic | command
	MaxRetries     int      `yaml:"max_retries"`     // fix requests after the first run
	MaxRetriesCap  int      `yaml:"max_retries_cap"` // most max_retries a call may ask for
	Timeout        Duration `yaml:"timeout"`         // budget of one autofix loop
	MaxTimeout     Duration `yaml:"max_timeout"`     // most timeout_seconds a call may ask for
	Success        string   `yaml:"success"`         // exit_zero_and_empty_stderr | exit_zero | tests
	SessionTTL     Duration `yaml:"session_ttl"`     // client: how long a needs_fix session waits for autofix_submit
	MaxTokens      int      `yaml:"max_tokens"`      // anthropic: max_tokens of each request
	CommandTimeout Duration `yaml:"command_timeout"` // command: time limit of one call of the fixer program
	Model          string   `yaml:"model"`           // anthropic: model; empty: provider default
	BaseURL        string   `yaml:"base_url"`        // anthropic: API URL; empty: provider default
	APIKeyEnv      string   `yaml:"api_key_env"`     // anthropic: variable holding the API key
	APIKeyFile     string   `yaml:"api_key_file"`    // anthropic: file holding the API key (wins over api_key_env)
	Command        []string `yaml:"command"`         // command: argv of the fixer program
}

// VM is the `vm` section.
type VM struct {
	QEMU   string            `yaml:"qemu"`    // binary name (looked up in PATH) or absolute path
	Accel  string            `yaml:"accel"`   // auto | kvm | tcg
	Images map[string]string `yaml:"images"`  // guest base image per OS
	MaxVMs int               `yaml:"max_vms"` // VMs at once; 0 disables VMs
	// BootTimeout bounds how long a VM booting an administrator's disk
	// (vm.images.<os>) may take until its QEMU guest agent answers.
	BootTimeout Duration `yaml:"boot_timeout"`
}

// Log is the `log` section.
// E2B is the `e2b` section: the E2B-compatible API, for the official E2B
// SDKs and what is built on them.
type E2B struct {
	// Listen is the TCP address (host:port) serving E2B's control plane
	// and, on the same port, its sandbox data plane (envd) and user ports.
	// Empty: off.
	Listen string `yaml:"listen"`
	// APIKeyFile holds the API keys (one per line, e2b_ and hex) clients
	// send as X-API-Key.
	APIKeyFile string `yaml:"api_key_file"`
	// Domain makes sandboxes reachable as {port}-{sandboxID}.{domain} (a
	// wildcard DNS name pointing at Listen); empty: only header routing
	// (E2B_SANDBOX_URL) works.
	Domain string `yaml:"domain"`
	// TLSCert and TLSKey (PEM files, together) serve Listen over TLS.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
}

// Audit is the `audit` section: the hash-chained log of authentication
// failures and of every call that changes anything.
type Audit struct {
	// Enabled turns the log on (the default).
	Enabled bool `yaml:"enabled"`
	// Dir holds the log's files; empty: STATE_DIR/audit.
	Dir string `yaml:"dir"`
	// MaxFileBytes and MaxFileAge rotate the current file.
	MaxFileBytes ByteSize `yaml:"max_file_bytes"`
	MaxFileAge   Duration `yaml:"max_file_age"`
	// MaxTotalBytes and RetentionAge delete the oldest files (0: no limit).
	MaxTotalBytes ByteSize `yaml:"max_total_bytes"`
	RetentionAge  Duration `yaml:"retention_age"`
	// CheckpointEvery stores the newest record's hash in the state
	// database after this many records (and every 10 seconds of activity).
	CheckpointEvery int `yaml:"checkpoint_every"`
	// VerifyInterval verifies the whole chain at start and then this
	// often, for the sandboxd_audit_chain_ok gauge (0: only on request).
	VerifyInterval Duration `yaml:"verify_interval"`
}

// Telemetry is the `telemetry` section: distributed traces exported over
// OTLP to the collector the administrator names (docs/SPEC.md, "Traces").
type Telemetry struct {
	// OTLPEndpoint is the collector's URL (http:// or https://); empty:
	// tracing off, at no cost.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// OTLPProtocol is "http/protobuf" (port 4318) or "grpc" (port 4317).
	OTLPProtocol string `yaml:"otlp_protocol"`
	// OTLPHeaders are sent with every export (a hosted collector's API
	// key): a secret, never logged.
	OTLPHeaders map[string]string `yaml:"otlp_headers"`
	// SampleRatio is the share of new traces recorded, 0 to 1; a caller's
	// traceparent decides for its own trace.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name the spans carry.
	ServiceName string `yaml:"service_name"`
}

// SSH is the `ssh` section: the SSH endpoint for ssh, scp, sftp, rsync
// and editors' remote-SSH. Its host key is generated once, as
// ssh_host_ed25519_key in paths.state_dir.
type SSH struct {
	// Listen is the TCP address (host:port) of the SSH endpoint; empty: off.
	Listen string `yaml:"listen"`
	// Keepalive is how often the endpoint checks an idle client is still
	// there; a client silent for three checks is disconnected. 0: never.
	Keepalive Duration `yaml:"keepalive"`
	// TokenTTL is how long a token `sandboxctl ssh` mints stays valid when
	// it asks for no other lifetime (a token is also single-use).
	TokenTTL Duration `yaml:"token_ttl"`
}

// MaxSSHTokenTTL bounds ssh.token_ttl and any lifetime a client asks for:
// a token is a password of the moment, not a credential to keep.
const MaxSSHTokenTTL = time.Hour

type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // json | text
}

// Default returns the documented default configuration, the one DefaultYAML
// spells out. Every call returns a fresh value that the caller may modify.
// Empty lists and maps are nil, which is also what an empty YAML list or
// mapping decodes to.
func Default() *Config {
	return &Config{
		Server: defaultServer(),
		Paths: Paths{
			StateDir:   "/var/lib/mcp-sandboxd",
			RunDir:     "/run/mcp-sandboxd",
			RecipesDir: "/usr/share/mcp-sandboxd/rootfs",
			SeccompDir: "/usr/share/mcp-sandboxd/seccomp-profiles",
			AgentPath:  "/usr/libexec/mcp-sandboxd/sandbox-agent",
		},
		Sandbox: defaultSandbox(),
		Network: defaultNetwork(),
		Images: Images{
			Suite:           "bookworm",
			BuildOnDemand:   true,
			MaxSize:         8 << 30,
			MaxManifestSize: 4 << 20,
		},
		Runs: Runs{
			MaxAge:       Duration(720 * time.Hour),
			MaxTotalSize: 10 << 30,
			LogCap:       64 << 20,
		},
		Snapshots: Snapshots{MaxAge: Duration(168 * time.Hour), MaxSize: 2 << 30},
		Volumes:   Volumes{DefaultSize: 1 << 30, MaxSize: 64 << 30, MaxVolumes: 256, MaxPerSandbox: 8},
		Webhooks: Webhooks{RetryBase: Duration(5 * time.Second), RetryMax: Duration(time.Hour), MaxAttempts: 8,
			DisableAfter: 20, MaxAge: Duration(168 * time.Hour), MaxWebhooks: 32},
		Autofix: defaultAutofix(),
		VM: VM{
			QEMU:        "qemu-system-x86_64",
			Accel:       "auto",
			MaxVMs:      2,
			BootTimeout: Duration(15 * time.Minute),
		},
		E2B:       E2B{APIKeyFile: "/etc/mcp-sandboxd/e2b-keys"},
		Audit:     defaultAudit(),
		SSH:       SSH{Keepalive: Duration(30 * time.Second), TokenTTL: Duration(5 * time.Minute)},
		Telemetry: Telemetry{OTLPProtocol: "http/protobuf", SampleRatio: 1, ServiceName: "mcp-sandboxd"},
		Gateway: Gateway{
			Listen: "127.0.0.1:7080", SecretFile: "/etc/mcp-sandboxd/gateway-secret",
			AuthTokenFile: "/etc/mcp-sandboxd/gateway-token", StateDB: "/var/lib/mcp-sandboxd/gateway.db",
			NodeTimeout: Duration(2 * time.Second), ProbeInterval: Duration(250 * time.Millisecond), ReconcileInterval: Duration(10 * time.Second),
		},
		Log: Log{
			Level:  "info",
			Format: "text",
		},
	}
}

// defaultServer is the front ends' defaults: local listeners only, every
// tool group.
func defaultServer() Server {
	return Server{
		Socket:        "/run/mcp-sandboxd/api.sock",
		SocketGroup:   "mcp-sandboxd",
		SocketMode:    "0660",
		HTTPAddr:      "127.0.0.1:7070",
		AuthTokenFile: "/etc/mcp-sandboxd/token",
		Tools:         append([]string(nil), ToolGroups...),

		MCPMaxResultBytes:   48 << 10,
		MCPOnSessionEnd:     SessionEndKeep,
		MCPProgressInterval: Duration(15 * time.Second),
		MaxRequestBytes:     4 << 20,

		PreviewListen: "127.0.0.1:7071",
	}
}

// defaultSandbox is a sandbox's default limits and the caps a request may
// raise them to.
func defaultSandbox() Sandbox {
	return Sandbox{
		Memory:             512 << 20,
		MaxMemory:          4 << 30,
		CPUs:               1,
		MaxCPUs:            2,
		Pids:               256,
		MaxPids:            4096,
		Disk:               1 << 30,
		MaxDisk:            8 << 30,
		DiskBacking:        "disk",
		ExecTimeout:        Duration(5 * time.Minute),
		MaxExecTimeout:     Duration(time.Hour),
		IdleTimeout:        Duration(30 * time.Minute),
		MaxLifetime:        Duration(24 * time.Hour),
		MaxSandboxes:       32,
		OutputLimit:        16 << 20,
		User:               1000,
		SeccompProfile:     "default",
		SeccompDiagnostics: true,
		Landlock:           "auto",
		CgroupParent:       "/mcp-sandboxd",
		CgroupFavorDynMods: true,
		UsernsPool:         UsernsPool{Base: 0x70000000, Size: 65536, Count: 2048},
	}
}

// defaultNetwork is the default network: no access, and egress (when asked
// for) denied to private, link-local and the host's ranges.
func defaultNetwork() Network {
	return Network{
		Bridge:      "sbx0",
		Subnet:      "10.88.0.0/16",
		DefaultMode: "none",
		Deny: []string{
			"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", // private
			"169.254.0.0/16", // link-local, cloud metadata
			"100.64.0.0/10",  // carrier-grade NAT
			"127.0.0.0/8",    // the host
			"fc00::/7", "fe80::/10", "::1/128",
		},
		CredentialPort: 8119,
		ApprovalHold:   Duration(30 * time.Second),
	}
}

// defaultAutofix is the autofix loop's defaults and caps.
func defaultAutofix() Autofix {
	return Autofix{
		Provider:       "client",
		MaxRetries:     5,
		MaxRetriesCap:  20,
		Timeout:        Duration(300 * time.Second),
		MaxTimeout:     Duration(1800 * time.Second),
		Success:        "exit_zero_and_empty_stderr",
		SessionTTL:     Duration(time.Hour),
		MaxTokens:      8192,
		CommandTimeout: Duration(120 * time.Second),
		APIKeyEnv:      "ANTHROPIC_API_KEY",
	}
}

// defaultAudit is the audit log's rotation and retention.
func defaultAudit() Audit {
	return Audit{
		Enabled:         true,
		MaxFileBytes:    64 << 20,
		MaxFileAge:      Duration(24 * time.Hour),
		MaxTotalBytes:   1 << 30,
		RetentionAge:    Duration(90 * 24 * time.Hour),
		CheckpointEvery: 256,
		VerifyInterval:  Duration(time.Hour),
	}
}

// NonDefault lists the keys ("network.default_mode") of a top-level section
// whose values differ from the defaults: what a build without the section's
// subsystem would silently ignore, so the engine refuses them instead.
func (c *Config) NonDefault(section string) []string {
	cv, dv := reflect.ValueOf(c).Elem(), reflect.ValueOf(Default()).Elem()
	var out []string
	for i := 0; i < cv.NumField(); i++ {
		if name, _, _ := strings.Cut(cv.Type().Field(i).Tag.Get("yaml"), ","); name != section {
			continue
		}
		sv, sd := cv.Field(i), dv.Field(i)
		for j := 0; j < sv.NumField(); j++ {
			key, _, _ := strings.Cut(sv.Type().Field(j).Tag.Get("yaml"), ",")
			if key != "" && key != "-" && !reflect.DeepEqual(sv.Field(j).Interface(), sd.Field(j).Interface()) {
				out = append(out, section+"."+key)
			}
		}
	}
	return out
}
