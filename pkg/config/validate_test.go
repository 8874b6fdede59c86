package config

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   []FieldError // Source is always empty from Validate
	}{
		{name: "defaults", modify: func(*Config) {}},
		{
			name:   "relative path",
			modify: func(c *Config) { c.Paths.StateDir = "var/lib" },
			want:   []FieldError{{Key: "paths.state_dir", Message: `must be an absolute path, got "var/lib"`}},
		},
		{
			name:   "missing path",
			modify: func(c *Config) { c.Server.Socket = "" },
			want:   []FieldError{{Key: "server.socket", Message: "required (an absolute path)"}},
		},
		{
			name:   "http without token",
			modify: func(c *Config) { c.Server.AuthTokenFile = "" },
			want:   []FieldError{{Key: "server.auth_token_file", Message: "required when server.http_addr is set"}},
		},
		{
			name: "no http, no token",
			modify: func(c *Config) {
				c.Server.HTTPAddr = ""
				c.Server.AuthTokenFile = ""
			},
		},
		{
			name: "e2b on",
			modify: func(c *Config) {
				c.E2B = E2B{Listen: "0.0.0.0:7072", APIKeyFile: "/etc/k", Domain: "sbx.example.com", TLSCert: "/etc/c.pem", TLSKey: "/etc/k.pem"}
			},
		},
		{
			name: "e2b bad",
			modify: func(c *Config) {
				c.E2B = E2B{Listen: "7072", APIKeyFile: "keys", Domain: "http://x/", TLSCert: "/etc/c.pem"}
			},
			want: []FieldError{
				{Key: "e2b.listen", Message: `invalid address "7072" (use host:port, e.g. 127.0.0.1:7070)`},
				{Key: "e2b.api_key_file", Message: `must be an absolute path, got "keys"`},
				{Key: "e2b.tls_cert", Message: "e2b.tls_cert and e2b.tls_key go together"},
				{Key: "e2b.tls_key", Message: "required (an absolute path)"},
				{Key: "e2b.domain", Message: `must be a DNS name like sandboxes.example.com, got "http://x/"`},
			},
		},
		{
			name: "node and gateway hostile",
			modify: func(c *Config) {
				c.Node = Node{Name: "../n1", GatewaySecretFile: "secret"}
				c.Gateway.Nodes = []GatewayNode{{Name: "n1", URL: "http://198.19.1.2:7070"}, {Name: "n1", URL: "file:///etc/passwd"}}
				c.Gateway.NodeTimeout = 0
			},
			want: []FieldError{
				{Key: "node.name", Message: `must be a DNS label ([a-z0-9-], at most 63), got "../n1"`},
				{Key: "node.gateway_secret_file", Message: `must be an absolute path, got "secret"`},
				{Key: "gateway.nodes[1].name", Message: `duplicate node "n1"`},
				{Key: "gateway.nodes[1].url", Message: `invalid URL "file:///etc/passwd" (use http:// or https://)`},
				{Key: "gateway.node_timeout", Message: "must be more than 0, got 0"},
			},
		},
		{
			name: "audit bad",
			modify: func(c *Config) {
				c.Audit = Audit{Dir: "audit", MaxFileBytes: 100, MaxFileAge: Duration(time.Second), MaxTotalBytes: 1000, RetentionAge: -1, CheckpointEvery: 0, VerifyInterval: Duration(time.Second)}
			},
			want: []FieldError{
				{Key: "audit.dir", Message: `must be an absolute path, got "audit"`},
				{Key: "audit.max_file_bytes", Message: "must be at least 4K, got 100"},
				{Key: "audit.max_file_age", Message: "must be at least 1m, got 1s"},
				{Key: "audit.retention_age", Message: "must be 0 (no limit) or positive, got -1ns"},
				{Key: "audit.checkpoint_every", Message: "must be from 1 to 1048576, got 0"},
				{Key: "audit.verify_interval", Message: "must be 0 (only on request) or at least 1m, got 1s"},
			},
		},
		{
			name: "postgres store",
			modify: func(c *Config) {
				c.Store.PostgresURL = "postgres://sandboxd@db.example:5432/sandboxd?sslmode=verify-full"
			},
		},
		{
			name:   "postgres store on a socket",
			modify: func(c *Config) { c.Store.PostgresURL = "postgresql:///sandboxd?host=/run/postgresql" },
		},
		{
			name:   "postgres store of another scheme",
			modify: func(c *Config) { c.Store.PostgresURL = "mysql://u:hunter2@db/x" },
			want:   []FieldError{{Key: "store.postgres_url", Message: `want a postgres:// or postgresql:// URL, got scheme "mysql"`}},
		},
		{
			name:   "postgres store without host",
			modify: func(c *Config) { c.Store.PostgresURL = "postgres:///sandboxd" },
			want:   []FieldError{{Key: "store.postgres_url", Message: "names no host (host:port, or ?host=/socket/dir)"}},
		},
		{
			name:   "postgres store not a URL, password not echoed",
			modify: func(c *Config) { c.Store.PostgresURL = "postgres://u:hunter2@db:5432%zz/x" },
			want:   []FieldError{{Key: "store.postgres_url", Message: "not a URL"}},
		},
		{
			name: "telemetry on",
			modify: func(c *Config) {
				c.Telemetry = Telemetry{OTLPEndpoint: "https://otel.example.com:4318", OTLPProtocol: "grpc", OTLPHeaders: map[string]string{"x-api-key": "s3cret"}, SampleRatio: 0.25, ServiceName: "sandboxd-eu"}
			},
		},
		{
			name: "telemetry bad",
			modify: func(c *Config) {
				c.Telemetry = Telemetry{OTLPEndpoint: "collector:4318", OTLPProtocol: "thrift", OTLPHeaders: map[string]string{"bad name": "s3cret\r\nX-Evil: 1"}, SampleRatio: 1.5, ServiceName: ""}
			},
			want: []FieldError{
				{Key: "telemetry.otlp_protocol", Message: `invalid value "thrift" (use http/protobuf, grpc)`},
				{Key: "telemetry.otlp_endpoint", Message: `invalid URL "collector:4318" (use http:// or https://)`},
				{Key: "telemetry.otlp_headers", Message: `header name "bad name" is not an HTTP token`},
				{Key: "telemetry.otlp_headers", Message: `value of "bad name" must be at most 4096 bytes without CR, LF or NUL`},
				{Key: "telemetry.sample_ratio", Message: "must be from 0 to 1, got 1.5"},
				{Key: "telemetry.service_name", Message: `must be 1 to 128 printable characters, got ""`},
			},
		},
		{
			name: "telemetry credentials in the URL",
			modify: func(c *Config) {
				c.Telemetry.OTLPEndpoint = "http://user:pw@collector:4318/v1/traces?k=v"
			},
			want: []FieldError{
				{Key: "telemetry.otlp_endpoint", Message: "must have no user info, query or fragment (put credentials in telemetry.otlp_headers)"},
			},
		},
		{
			name:   "e2b without keys",
			modify: func(c *Config) { c.E2B = E2B{Listen: "127.0.0.1:7072"} },
			want:   []FieldError{{Key: "e2b.api_key_file", Message: "required when e2b.listen is set"}},
		},
		{
			name:   "bad http_addr",
			modify: func(c *Config) { c.Server.HTTPAddr = "localhost" },
			want:   []FieldError{{Key: "server.http_addr", Message: `invalid address "localhost" (use host:port, e.g. 127.0.0.1:7070)`}},
		},
		{
			name:   "bad port",
			modify: func(c *Config) { c.Server.HTTPAddr = ":http" },
			want:   []FieldError{{Key: "server.http_addr", Message: `invalid port "http" (use 1 to 65535)`}},
		},
		{
			name:   "unknown tool group",
			modify: func(c *Config) { c.Server.Tools = []string{"sandbox", "file", "sandbox"} },
			want: []FieldError{
				{Key: "server.tools[1]", Message: `unknown tool group "file" (did you mean "files"?) (use sandbox, exec, files, run, images, autofix, vm)`},
				{Key: "server.tools[2]", Message: `tool group "sandbox" listed twice`},
			},
		},
		{
			name:   "default over cap",
			modify: func(c *Config) { c.Sandbox.Memory = 8 << 30 },
			want:   []FieldError{{Key: "sandbox.memory", Message: "8G exceeds sandbox.max_memory 4G"}},
		},
		{
			name: "below minimums",
			modify: func(c *Config) {
				c.Sandbox.Memory = 8 << 20
				c.Sandbox.Pids = 4
				c.Sandbox.Disk = 1 << 20
				c.Sandbox.ExecTimeout = 0
				c.Sandbox.OutputLimit = 100
			},
			want: []FieldError{
				{Key: "sandbox.memory", Message: "8M is below the minimum of 16M"},
				{Key: "sandbox.pids", Message: "4 is below the minimum of 16"},
				{Key: "sandbox.disk", Message: "1M is below the minimum of 16M"},
				{Key: "sandbox.exec_timeout", Message: "0 is below the minimum of 1s"},
				{Key: "sandbox.output_limit", Message: "100 is below the minimum of 1K"},
			},
		},
		{
			name: "cpus",
			modify: func(c *Config) {
				c.Sandbox.CPUs = 3
			},
			want: []FieldError{{Key: "sandbox.cpus", Message: "3 exceeds sandbox.max_cpus 2"}},
		},
		{
			name:   "zero cpus",
			modify: func(c *Config) { c.Sandbox.CPUs = 0 },
			want:   []FieldError{{Key: "sandbox.cpus", Message: "must be greater than 0, got 0"}},
		},
		{
			name:   "exec timeout over cap",
			modify: func(c *Config) { c.Sandbox.ExecTimeout = Duration(2 * c.Sandbox.MaxExecTimeout) },
			want:   []FieldError{{Key: "sandbox.exec_timeout", Message: "2h exceeds sandbox.max_exec_timeout 1h"}},
		},
		{
			name: "counts",
			modify: func(c *Config) {
				c.Sandbox.MaxSandboxes = 0
				c.Autofix.MaxRetries = -1
				c.VM.MaxVMs = -1
			},
			want: []FieldError{
				{Key: "sandbox.max_sandboxes", Message: "must be at least 1, got 0"},
				{Key: "autofix.max_retries", Message: "must be between 1 and autofix.max_retries_cap (20), got -1"},
				{Key: "vm.max_vms", Message: "must not be negative (0 disables VMs), got -1"},
			},
		},
		{
			name:   "root user",
			modify: func(c *Config) { c.Sandbox.User = 0 },
			want:   []FieldError{{Key: "sandbox.user", Message: "must be a uid from 1 to 65535, got 0"}},
		},
		{
			name:   "seccomp profile path",
			modify: func(c *Config) { c.Sandbox.SeccompProfile = "../etc/x" },
			want:   []FieldError{{Key: "sandbox.seccomp_profile", Message: `invalid profile name "../etc/x" (a file name in paths.seccomp_dir without .json, or "unconfined")`}},
		},
		{
			name:   "seccomp unconfined",
			modify: func(c *Config) { c.Sandbox.SeccompProfile = "unconfined" },
		},
		{
			name:   "landlock mode",
			modify: func(c *Config) { c.Sandbox.Landlock = "on" },
			want:   []FieldError{{Key: "sandbox.landlock", Message: `invalid mode "on" (auto, require or off)`}},
		},
		{
			name: "pool",
			modify: func(c *Config) {
				c.Images.Languages = []string{"python", "node"}
				c.Sandbox.MaxSandboxes = 4
				c.Sandbox.Pool = map[string]int{"python": 3, "node": 2, "rust": 1, "go": -1}
			},
			want: []FieldError{
				{Key: "sandbox.pool.go", Message: `language "go" is not enabled in images.languages`},
				{Key: "sandbox.pool.rust", Message: `language "rust" is not enabled in images.languages`},
				{Key: "sandbox.pool", Message: "6 warm sandboxes exceed sandbox.max_sandboxes 4"},
			},
		},
		{
			name:   "negative pool",
			modify: func(c *Config) { c.Sandbox.Pool = map[string]int{"go": -1} },
			want:   []FieldError{{Key: "sandbox.pool.go", Message: "must not be negative, got -1"}},
		},
		{
			name:   "cgroup parent root",
			modify: func(c *Config) { c.Sandbox.CgroupParent = "/" },
			want:   []FieldError{{Key: "sandbox.cgroup_parent", Message: "must not be the root cgroup"}},
		},
		{
			name:   "cgroup parent relative",
			modify: func(c *Config) { c.Sandbox.CgroupParent = "mcp-sandboxd" },
			want:   []FieldError{{Key: "sandbox.cgroup_parent", Message: `must be an absolute cgroup path, got "mcp-sandboxd"`}},
		},
		{
			name:   "cgroup parent unclean",
			modify: func(c *Config) { c.Sandbox.CgroupParent = "/a/../b/" },
			want:   []FieldError{{Key: "sandbox.cgroup_parent", Message: `"/a/../b/" is not a clean path (did you mean "/b"?)`}},
		},
		{
			name: "network",
			modify: func(c *Config) {
				c.Network.Bridge = "a-very-long-bridge-name"
				c.Network.DefaultMode = "open"
				c.Network.Deny = []string{"10.0.0.0/8", "10.0.0.0/33", "fe80::1/10"}
				c.Network.DNS = []string{"8.8.8.8", "dns.google"}
			},
			want: []FieldError{
				{Key: "network.bridge", Message: `invalid interface name "a-very-long-bridge-name" (1 to 15 characters, no '/', ':' or spaces)`},
				{Key: "network.default_mode", Message: `invalid value "open" (use none, egress, allowlist)`},
				{Key: "network.deny[1]", Message: `invalid CIDR "10.0.0.0/33" (e.g. 10.0.0.0/8)`},
				{Key: "network.deny[2]", Message: `"fe80::1/10" has host bits set (did you mean "fe80::/10"?)`},
				{Key: "network.dns[1]", Message: `invalid IP address "dns.google"`},
			},
		},
		{
			name:   "approval hold too long",
			modify: func(c *Config) { c.Network.ApprovalHold = Duration(time.Minute) },
			want:   []FieldError{{Key: "network.approval_hold", Message: "1m0s is outside 1s..40s"}},
		},
		{
			name:   "approval hold zero",
			modify: func(c *Config) { c.Network.ApprovalHold = 0 },
			want:   []FieldError{{Key: "network.approval_hold", Message: "0s is outside 1s..40s"}},
		},
		{
			name:   "ipv6 subnet",
			modify: func(c *Config) { c.Network.Subnet = "fd00::/64" },
			want:   []FieldError{{Key: "network.subnet", Message: `must be an IPv4 CIDR, got "fd00::/64"`}},
		},
		{
			name:   "tiny subnet",
			modify: func(c *Config) { c.Network.Subnet = "10.88.0.0/31" },
			want:   []FieldError{{Key: "network.subnet", Message: `"10.88.0.0/31" is too small (use a /30 or larger)`}},
		},
		{
			name: "images",
			modify: func(c *Config) {
				c.Images.Mirror = "mirror.example/debian"
				c.Images.Suite = "book worm"
				c.Images.Languages = []string{"python", "python", "../x"}
			},
			want: []FieldError{
				{Key: "images.mirror", Message: `invalid URL "mirror.example/debian" (use http:// or https://)`},
				{Key: "images.suite", Message: `invalid suite name "book worm"`},
				{Key: "images.languages[1]", Message: `language "python" listed twice`},
				{Key: "images.languages[2]", Message: `invalid language name "../x"`},
			},
		},
		{
			name: "autofix",
			modify: func(c *Config) {
				c.Autofix.Provider = "openai"
				c.Autofix.Success = "exit0"
				c.Autofix.Timeout = 0
				c.Autofix.BaseURL = "ftp://example.com"
				c.Autofix.APIKeyEnv = "MY-KEY"
				c.Autofix.APIKeyFile = "key.txt"
			},
			want: []FieldError{
				{Key: "autofix.provider", Message: `invalid value "openai" (use client, sampling, anthropic, command, agent)`},
				{Key: "autofix.timeout", Message: "must be greater than 0"},
				{Key: "autofix.success", Message: `invalid value "exit0" (use exit_zero_and_empty_stderr, exit_zero, tests)`},
				{Key: "autofix.base_url", Message: `invalid URL "ftp://example.com" (use http:// or https://)`},
				{Key: "autofix.api_key_env", Message: `invalid environment variable name "MY-KEY"`},
				{Key: "autofix.api_key_file", Message: `must be an absolute path, got "key.txt"`},
			},
		},
		{
			name: "network credentials",
			modify: func(c *Config) {
				c.Network.CredentialPort = 53
				c.Network.Credentials = map[string]Credential{
					"bad":  {BaseURL: "ftp://x", Header: "x api key", SecretEnv: "K", SecretFile: "/k", MaxRequests: -1},
					"good": {BaseURL: "https://api.example", Header: "x-api-key", SecretFile: "/etc/k", BaseURLEnv: "API_BASE_URL"},
				}
			},
			want: []FieldError{
				{Key: "network.credential_port", Message: "want a TCP port other than 53, got 53"},
				{Key: "network.credentials.bad.base_url", Message: `invalid URL "ftp://x" (use http:// or https://)`},
				{Key: "network.credentials.bad.header", Message: `want a header name, got "x api key"`},
				{Key: "network.credentials.bad.secret_env", Message: "give exactly one of secret_env and secret_file"},
				{Key: "network.credentials.bad.base_url_env", Message: "required (the sandbox's variable naming the proxy's URL)"},
				{Key: "network.credentials.bad.max_requests", Message: "caps must not be negative"},
			},
		},
		{
			name: "anthropic without a key",
			modify: func(c *Config) {
				c.Autofix.Provider = "anthropic"
				c.Autofix.APIKeyEnv = ""
			},
			want: []FieldError{{Key: "autofix.api_key_env", Message: "required when autofix.provider is anthropic (or set autofix.api_key_file)"}},
		},
		{
			name:   "command without a command",
			modify: func(c *Config) { c.Autofix.Provider = "command" },
			want:   []FieldError{{Key: "autofix.command", Message: "required when autofix.provider is command"}},
		},
		{
			name: "vm",
			modify: func(c *Config) {
				c.VM.QEMU = "bin/qemu"
				c.VM.Accel = "hvf"
				c.VM.Images = map[string]string{"linux": "linux.qcow2", "win/10": "/x"}
			},
			want: []FieldError{
				{Key: "vm.qemu", Message: `must be a program name or an absolute path, got "bin/qemu"`},
				{Key: "vm.accel", Message: `invalid value "hvf" (use auto, kvm, tcg)`},
				{Key: "vm.images.linux", Message: `must be an absolute path, got "linux.qcow2"`},
				{Key: "vm.images.win/10", Message: `invalid OS name "win/10"`},
			},
		},
		{
			name: "log",
			modify: func(c *Config) {
				c.Log.Level = "verbose"
				c.Log.Format = "xml"
			},
			want: []FieldError{
				{Key: "log.level", Message: `invalid value "verbose" (use debug, info, warn, error)`},
				{Key: "log.format", Message: `invalid value "xml" (use json, text)`},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Validate() = %v, want a *ValidationError", err)
			}
			if !reflect.DeepEqual(verr.Errors, tt.want) {
				t.Fatalf("errors:\n got %q\nwant %q", verr.Errors, tt.want)
			}
		})
	}
}

func TestValidationErrorPrintsOnePerLine(t *testing.T) {
	err := &ValidationError{Errors: []FieldError{
		{Key: "sandbox.memory", Message: "8G exceeds sandbox.max_memory 4G"},
		{Key: "log.level", Message: `invalid value "x" (use debug, info, warn, error)`, Source: "/etc/c.yaml:40"},
	}}
	want := "sandbox.memory: 8G exceeds sandbox.max_memory 4G\n" +
		`/etc/c.yaml:40: log.level: invalid value "x" (use debug, info, warn, error)`
	if got := err.Error(); got != want {
		t.Fatalf("Error() =\n%s\nwant\n%s", got, want)
	}
}
