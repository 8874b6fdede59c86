// Package config holds mcp-sandboxd's configuration: the typed structure, its
// documented defaults, YAML loading with key-path errors, SANDBOXD_* environment
// overrides and validation. config/mcp-sandboxd.yaml is DefaultYAML verbatim.
package config

// Config is the whole configuration file.
type Config struct {
	Server  Server  `yaml:"server"`
	Paths   Paths   `yaml:"paths"`
	Sandbox Sandbox `yaml:"sandbox"`
	Network Network `yaml:"network"`
	Images  Images  `yaml:"images"`
	Autofix Autofix `yaml:"autofix"`
	VM      VM      `yaml:"vm"`
	Log     Log     `yaml:"log"`
}

// Server is the `server` section.
type Server struct {
	Socket        string   `yaml:"socket"`          // REST API unix socket
	HTTPAddr      string   `yaml:"http_addr"`       // REST, MCP (/mcp), health, metrics
	AuthTokenFile string   `yaml:"auth_token_file"` // bearer token for HTTP (all but /healthz)
	Tools         []string `yaml:"tools"`           // enabled MCP tool groups
}

// Paths is the `paths` section.
type Paths struct {
	StateDir   string `yaml:"state_dir"`   // SQLite, images, runs (persistent)
	RunDir     string `yaml:"run_dir"`     // libcontainer state, sandbox mounts, lock (tmpfs)
	RecipesDir string `yaml:"recipes_dir"` // rootfs recipes
	SeccompDir string `yaml:"seccomp_dir"` // seccomp profiles
	AgentPath  string `yaml:"agent_path"`  // the static sandbox-agent binary
}

// Sandbox is the `sandbox` section: defaults and caps for sandbox limits.
type Sandbox struct {
	Memory         ByteSize       `yaml:"memory"`       // default memory limit (no swap)
	MaxMemory      ByteSize       `yaml:"max_memory"`   // cap on a requested memory limit
	CPUs           float64        `yaml:"cpus"`         // default CPU quota in cores
	MaxCPUs        float64        `yaml:"max_cpus"`     // cap
	Pids           int64          `yaml:"pids"`         // default pids limit
	MaxPids        int64          `yaml:"max_pids"`     // cap
	Disk           ByteSize       `yaml:"disk"`         // default writable-layer size
	MaxDisk        ByteSize       `yaml:"max_disk"`     // cap
	ExecTimeout    Duration       `yaml:"exec_timeout"` // default per-command timeout
	MaxExecTimeout Duration       `yaml:"max_exec_timeout"`
	IdleTimeout    Duration       `yaml:"idle_timeout"`    // terminate after this long ready and unused (0: never)
	MaxLifetime    Duration       `yaml:"max_lifetime"`    // terminate after this long in any state (0: never)
	MaxSandboxes   int            `yaml:"max_sandboxes"`   // live (not terminated) sandboxes at once
	OutputLimit    ByteSize       `yaml:"output_limit"`    // per stream, per command
	User           int            `yaml:"user"`            // uid (and gid) commands run as
	SeccompProfile string         `yaml:"seccomp_profile"` // profile name in seccomp_dir, or "unconfined"
	Pool           map[string]int `yaml:"pool"`            // warm sandboxes per language
	CgroupParent   string         `yaml:"cgroup_parent"`   // absolute cgroup path of the daemon's parent
}

// Network is the `network` section.
type Network struct {
	Bridge      string   `yaml:"bridge"`
	Subnet      string   `yaml:"subnet"`
	DefaultMode string   `yaml:"default_mode"` // none | egress | allowlist
	Deny        []string `yaml:"deny"`         // CIDRs always refused
	DNS         []string `yaml:"dns"`
}

// Images is the `images` section.
type Images struct {
	Mirror    string   `yaml:"mirror"`    // Debian mirror; empty: the host's apt sources
	Suite     string   `yaml:"suite"`     // default suite for recipes that name none
	Languages []string `yaml:"languages"` // enabled recipes; empty: all
}

// Autofix is the `autofix` section.
type Autofix struct {
	Provider   string   `yaml:"provider"` // client | anthropic | command
	MaxRetries int      `yaml:"max_retries"`
	Timeout    Duration `yaml:"timeout"`
	Success    string   `yaml:"success"` // exit_zero_and_empty_stderr | exit_zero
	Model      string   `yaml:"model"`
	BaseURL    string   `yaml:"base_url"`
	APIKeyEnv  string   `yaml:"api_key_env"`
	APIKeyFile string   `yaml:"api_key_file"`
	Command    []string `yaml:"command"`
}

// VM is the `vm` section.
type VM struct {
	QEMU   string            `yaml:"qemu"`
	Accel  string            `yaml:"accel"` // auto | kvm | tcg
	Images map[string]string `yaml:"images"`
	MaxVMs int               `yaml:"max_vms"`
}

// Log is the `log` section.
type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // json | text
}
