package config

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

var update = flag.Bool("update", false, "rewrite config/mcp-sandboxd.yaml from DefaultYAML")

// defaultFile is the repository's documented default configuration.
const defaultFile = "../../config/mcp-sandboxd.yaml"

// noEnv keeps the test process's own environment out of Parse.
var noEnv = WithLookupEnv(nil)

// env returns an Option that reads overrides from m only.
func env(m map[string]string) Option {
	return WithLookupEnv(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
}

func TestDefaultYAMLFileMatches(t *testing.T) {
	if *update {
		if err := os.WriteFile(defaultFile, []byte(DefaultYAML), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(defaultFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != DefaultYAML {
		t.Fatalf("%s differs from DefaultYAML; run go test ./pkg/config -run TestDefaultYAMLFileMatches -update", defaultFile)
	}
}

func TestDefaultYAMLParsesToDefault(t *testing.T) {
	got, err := Parse([]byte(DefaultYAML), noEnv)
	if err != nil {
		t.Fatalf("Parse(DefaultYAML): %v", err)
	}
	if want := Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse(DefaultYAML) differs from Default():\n got %+v\nwant %+v", got, want)
	}
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate(): %v", err)
	}
}

// TestDefaultYAMLDocumentsEveryKey checks that DefaultYAML spells out every
// key of Config, each under a comment, so that parsing it giving Default() is
// not an accident of keys left out.
func TestDefaultYAMLDocumentsEveryKey(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(DefaultYAML), &doc); err != nil {
		t.Fatal(err)
	}
	written := map[string]bool{}
	root := doc.Content[0]
	for i := 0; i < len(root.Content); i += 2 {
		section := root.Content[i+1]
		for j := 0; j < len(section.Content); j += 2 {
			k := section.Content[j]
			key := root.Content[i].Value + "." + k.Value
			written[key] = true
			// A cap shares the comment of the default just above it
			// (memory, max_memory).
			isCap := j >= 2 && k.Value == "max_"+section.Content[j-2].Value
			if k.HeadComment == "" && !isCap {
				t.Errorf("%s has no comment", key)
			}
		}
	}
	for _, key := range leafKeys(reflect.TypeFor[Config](), "") {
		if !written[key] {
			t.Errorf("DefaultYAML does not document %s", key)
		}
	}
}

// leafKeys lists the key paths of t's fields, sections expanded.
func leafKeys(t reflect.Type, prefix string) []string {
	var keys []string
	index, names := fields(t)
	for _, name := range names {
		f := t.Field(index[name])
		if f.Type.Kind() == reflect.Struct {
			keys = append(keys, leafKeys(f.Type, join(prefix, name))...)
			continue
		}
		keys = append(keys, join(prefix, name))
	}
	return keys
}

func TestDefaultReturnsFreshValues(t *testing.T) {
	a := Default()
	a.Network.Deny[0] = "changed"
	a.Server.Tools[0] = "changed"
	if b := Default(); b.Network.Deny[0] == "changed" || b.Server.Tools[0] == "changed" || ToolGroups[0] == "changed" {
		t.Fatal("Default() shares slices between calls")
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c := Default()
	c.Sandbox.Pool = map[string]int{"python": 2, "node": 1}
	c.Sandbox.CPUs = 0.5
	c.Sandbox.ExecTimeout = Duration(90 * time.Second)
	c.VM.Images = map[string]string{"linux": "/var/lib/mcp-sandboxd/vm/linux.qcow2"}
	c.Network.DNS = []string{"1.1.1.1"}
	c.Autofix.Provider = "command"
	c.Autofix.Command = []string{"/usr/local/bin/fixer", "--json"}
	for _, want := range []*Config{Default(), c} {
		out, err := Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(out, noEnv)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip changed the config:\n got %+v\nwant %+v\nyaml:\n%s", got, want, out)
		}
	}
	out, _ := Marshal(c)
	for _, line := range []string{"  memory: 512M\n", "  exec_timeout: 1m30s\n", "  cpus: 0.5\n"} {
		if !strings.Contains(string(out), line) {
			t.Errorf("Marshal output lacks %q:\n%s", line, out)
		}
	}
}

func TestParseOverlaysDefaults(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(*Config)
	}{
		{name: "empty file", yaml: ""},
		{name: "only comments", yaml: "# nothing here\n"},
		{name: "empty section", yaml: "sandbox:\n# memory: 1G\n"},
		{
			name: "scalars",
			yaml: "sandbox:\n  memory: 1G\n  cpus: 1.5\n  pids: 512\n  exec_timeout: 90s\nlog:\n  level: debug\n",
			want: func(c *Config) {
				c.Sandbox.Memory = 1 << 30
				c.Sandbox.CPUs = 1.5
				c.Sandbox.Pids = 512
				c.Sandbox.ExecTimeout = Duration(90 * time.Second)
				c.Log.Level = "debug"
			},
		},
		{
			name: "lists replace the default",
			yaml: "network:\n  deny: [10.0.0.0/8]\n  dns: [1.1.1.1, 2606:4700:4700::1111]\n",
			want: func(c *Config) {
				c.Network.Deny = []string{"10.0.0.0/8"}
				c.Network.DNS = []string{"1.1.1.1", "2606:4700:4700::1111"}
			},
		},
		{
			name: "empty list and null",
			yaml: "network:\n  deny: []\nserver:\n  tools:\n  http_addr:\n",
			want: func(c *Config) {
				c.Network.Deny = nil
				c.Server.Tools = nil
				c.Server.HTTPAddr = ""
			},
		},
		{
			name: "maps",
			yaml: "sandbox:\n  pool: {python: 2, node: 1}\nvm:\n  images:\n    linux: /srv/linux.qcow2\n",
			want: func(c *Config) {
				c.Sandbox.Pool = map[string]int{"python": 2, "node": 1}
				c.VM.Images = map[string]string{"linux": "/srv/linux.qcow2"}
			},
		},
		{
			name: "anchors and aliases",
			yaml: "images:\n  languages: &langs [python, node]\nsandbox:\n  pool: {python: 1}\n",
			want: func(c *Config) {
				c.Images.Languages = []string{"python", "node"}
				c.Sandbox.Pool = map[string]int{"python": 1}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml), noEnv)
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			if tt.want != nil {
				tt.want(want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		yaml string
		want func(*Config)
	}{
		{
			name: "string",
			env:  map[string]string{"SANDBOXD_SERVER_HTTP_ADDR": "0.0.0.0:8080"},
			want: func(c *Config) { c.Server.HTTPAddr = "0.0.0.0:8080" },
		},
		{
			name: "empty string",
			env:  map[string]string{"SANDBOXD_SERVER_HTTP_ADDR": ""},
			want: func(c *Config) { c.Server.HTTPAddr = "" },
		},
		{
			name: "size, number, integer, duration",
			env: map[string]string{
				"SANDBOXD_SANDBOX_MEMORY":        "1G",
				"SANDBOXD_SANDBOX_CPUS":          "0.5",
				"SANDBOXD_SANDBOX_MAX_SANDBOXES": "4",
				"SANDBOXD_SANDBOX_IDLE_TIMEOUT":  "0",
			},
			want: func(c *Config) {
				c.Sandbox.Memory = 1 << 30
				c.Sandbox.CPUs = 0.5
				c.Sandbox.MaxSandboxes = 4
				c.Sandbox.IdleTimeout = 0
			},
		},
		{
			name: "list",
			env:  map[string]string{"SANDBOXD_NETWORK_DNS": " 1.1.1.1, 9.9.9.9 ,"},
			want: func(c *Config) { c.Network.DNS = []string{"1.1.1.1", "9.9.9.9"} },
		},
		{
			name: "empty list",
			env:  map[string]string{"SANDBOXD_NETWORK_DENY": ""},
			want: func(c *Config) { c.Network.Deny = nil },
		},
		{
			name: "map",
			env:  map[string]string{"SANDBOXD_SANDBOX_POOL": "python=2, node=1"},
			want: func(c *Config) { c.Sandbox.Pool = map[string]int{"python": 2, "node": 1} },
		},
		{
			name: "wins over the file",
			yaml: "sandbox:\n  memory: 256M\n  disk: 2G\n",
			env:  map[string]string{"SANDBOXD_SANDBOX_MEMORY": "1G"},
			want: func(c *Config) {
				c.Sandbox.Memory = 1 << 30
				c.Sandbox.Disk = 2 << 30
			},
		},
		{
			name: "unrelated SANDBOXD variables are ignored",
			env:  map[string]string{"SANDBOXD_SOCKET": "/tmp/x.sock", "SANDBOXD_INTEGRATION": "1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml), env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			if tt.want != nil {
				tt.want(want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestEnvCoversEveryKey checks that every key has exactly one environment
// variable, named SANDBOXD_<SECTION>_<KEY>.
func TestEnvCoversEveryKey(t *testing.T) {
	var asked []string
	lookup := func(k string) (string, bool) { asked = append(asked, k); return "", false }
	if _, err := Parse(nil, WithLookupEnv(lookup)); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, key := range leafKeys(reflect.TypeFor[Config](), "") {
		want = append(want, "SANDBOXD_"+strings.ToUpper(strings.ReplaceAll(key, ".", "_")))
	}
	if !slices.Equal(asked, want) {
		t.Fatalf("looked up %v\nwant %v", asked, want)
	}
	if !slices.Contains(asked, "SANDBOXD_SERVER_HTTP_ADDR") {
		t.Fatal("SANDBOXD_SERVER_HTTP_ADDR not looked up")
	}
	slices.Sort(asked)
	if len(slices.Compact(asked)) != len(want) {
		t.Fatal("two keys share an environment variable")
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		want []FieldError
	}{
		{
			name: "invalid size",
			yaml: "sandbox:\n  memory: 12X\n",
			want: []FieldError{{"sandbox.memory", `invalid size "12X" (use K, M, G, T)`, "line 2"}},
		},
		{
			name: "unknown key with suggestion",
			yaml: "server:\n  htp_addr: 127.0.0.1:1\n",
			want: []FieldError{{"server.htp_addr", `unknown key (did you mean "http_addr"?)`, "line 2"}},
		},
		{
			name: "unknown key without suggestion",
			yaml: "server:\n  colour: blue\n",
			want: []FieldError{{"server.colour", "unknown key", "line 2"}},
		},
		{
			name: "unknown section",
			yaml: "sandbx:\n  memory: 1G\n",
			want: []FieldError{{"sandbx", `unknown key (did you mean "sandbox"?)`, "line 1"}},
		},
		{
			name: "string for an integer",
			yaml: "sandbox:\n  pids: lots\n",
			want: []FieldError{{"sandbox.pids", `expected an integer, got "lots"`, "line 2"}},
		},
		{
			name: "integer out of range",
			yaml: "sandbox:\n  pids: 99999999999999999999\n",
			want: []FieldError{{"sandbox.pids", `integer "99999999999999999999" out of range`, "line 2"}},
		},
		{
			name: "string for a number",
			yaml: "sandbox:\n  cpus: two\n",
			want: []FieldError{{"sandbox.cpus", `expected a number, got "two"`, "line 2"}},
		},
		{
			name: "list for a map",
			yaml: "sandbox:\n  pool: [python]\n",
			want: []FieldError{{"sandbox.pool", "expected a mapping of keys to values, got a list", "line 2"}},
		},
		{
			name: "scalar for a list",
			yaml: "network:\n  deny: 10.0.0.0/8\n",
			want: []FieldError{{"network.deny", `expected a list, got "10.0.0.0/8"`, "line 2"}},
		},
		{
			name: "mapping for a string",
			yaml: "log:\n  level: {a: b}\n",
			want: []FieldError{{"log.level", "expected a string, got a mapping", "line 2"}},
		},
		{
			name: "scalar for a section",
			yaml: "vm: yes\n",
			want: []FieldError{{"vm", `expected a mapping of keys to values, got "yes"`, "line 1"}},
		},
		{
			name: "list element",
			yaml: "network:\n  deny:\n    - 10.0.0.0/8\n    - [nested]\n",
			want: []FieldError{{"network.deny[1]", "expected a string, got a list", "line 4"}},
		},
		{
			name: "map value",
			yaml: "sandbox:\n  pool:\n    python: many\n",
			want: []FieldError{{"sandbox.pool.python", `expected an integer, got "many"`, "line 3"}},
		},
		{
			name: "null for a size",
			yaml: "sandbox:\n  disk:\n",
			want: []FieldError{{"sandbox.disk", "expected a size (e.g. 512M), got nothing", "line 2"}},
		},
		{
			name: "duplicate key",
			yaml: "log:\n  level: info\n  level: debug\n",
			want: []FieldError{{"log.level", "duplicate key (first set on line 2)", "line 3"}},
		},
		{
			name: "duplicate map key",
			yaml: "sandbox:\n  pool:\n    python: 1\n    python: 2\n",
			want: []FieldError{{"sandbox.pool.python", "duplicate key (first set on line 3)", "line 4"}},
		},
		{
			name: "non-scalar key",
			yaml: "log:\n  ? [level]\n  : info\n",
			want: []FieldError{{"log", "keys must be plain names, got a list", "line 2"}},
		},
		{
			name: "invalid duration",
			yaml: "autofix:\n  timeout: 5\n",
			want: []FieldError{{"autofix.timeout", `invalid duration "5" (use e.g. 30s, 5m, 1h)`, "line 2"}},
		},
		{
			name: "invalid env value",
			env:  map[string]string{"SANDBOXD_SANDBOX_MEMORY": "lots"},
			want: []FieldError{{"sandbox.memory", `invalid size "lots" (use K, M, G, T)`, "SANDBOXD_SANDBOX_MEMORY"}},
		},
		{
			name: "invalid env map",
			env:  map[string]string{"SANDBOXD_SANDBOX_POOL": "python=2,node"},
			want: []FieldError{{"sandbox.pool", `expected key=value pairs separated by commas, got "node"`, "SANDBOXD_SANDBOX_POOL"}},
		},
		{
			name: "invalid env map value",
			env:  map[string]string{"SANDBOXD_SANDBOX_POOL": "python=two"},
			want: []FieldError{{"sandbox.pool.python", `expected an integer, got "two"`, "SANDBOXD_SANDBOX_POOL"}},
		},
		{
			name: "semantic check located in the file",
			yaml: "sandbox:\n  memory: 8G\n",
			want: []FieldError{{"sandbox.memory", "8G exceeds sandbox.max_memory 4G", "line 2"}},
		},
		{
			name: "semantic check on a list element",
			yaml: "network:\n  deny:\n    - 10.0.0.0/8\n    - 10.1.2.3/8\n",
			want: []FieldError{{"network.deny[1]", `"10.1.2.3/8" has host bits set (did you mean "10.0.0.0/8"?)`, "line 4"}},
		},
		{
			name: "semantic check on an env list",
			env:  map[string]string{"SANDBOXD_NETWORK_DNS": "1.1.1.1,dns.google"},
			want: []FieldError{{"network.dns[1]", `invalid IP address "dns.google"`, "SANDBOXD_NETWORK_DNS"}},
		},
		{
			name: "a value that failed to decode is not checked again",
			yaml: "sandbox:\n  memory: 12X\n  max_memory: 256M\n",
			want: []FieldError{{"sandbox.memory", `invalid size "12X" (use K, M, G, T)`, "line 2"}},
		},
		{
			name: "a default is checked without a location",
			yaml: "sandbox:\n  max_memory: 256M\n",
			want: []FieldError{{"sandbox.memory", "512M exceeds sandbox.max_memory 256M", ""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml), env(tt.env))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse = %+v, %v; want a *ValidationError", cfg, err)
			}
			if cfg != nil {
				t.Error("Parse returned a config along with an error")
			}
			if !reflect.DeepEqual(verr.Errors, tt.want) {
				t.Fatalf("errors:\n got %q\nwant %q", verr.Errors, tt.want)
			}
		})
	}
}

func TestParseReportsEveryError(t *testing.T) {
	const in = `server:
  htp_addr: 127.0.0.1:7070
sandbox:
  memory: 12X
  user: 0
network:
  default_mode: open
`
	_, err := Parse([]byte(in), env(map[string]string{"SANDBOXD_LOG_LEVEL": "loud"}))
	want := strings.Join([]string{
		`line 2: server.htp_addr: unknown key (did you mean "http_addr"?)`,
		`line 4: sandbox.memory: invalid size "12X" (use K, M, G, T)`,
		`line 5: sandbox.user: must be a uid from 1 to 65535, got 0`,
		`line 7: network.default_mode: invalid value "open" (use none, egress, allowlist)`,
		`SANDBOXD_LOG_LEVEL: log.level: invalid value "loud" (use debug, info, warn, error)`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("error:\n%v\nwant:\n%s", err, want)
	}
}

func TestParseSyntaxError(t *testing.T) {
	_, err := Parse([]byte("server:\n  socket: [unclosed\n"), noEnv)
	var verr *ValidationError
	if err == nil || errors.As(err, &verr) || !strings.Contains(err.Error(), "line") {
		t.Fatalf("Parse = %v; want a YAML syntax error with a line number", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("log:\n  format: json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("log:\n  format: xml\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg, err := Load(good, env(map[string]string{"SANDBOXD_LOG_LEVEL": "warn"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Log.Format != "json" || cfg.Log.Level != "warn" {
		t.Fatalf("Load: log = %+v", cfg.Log)
	}

	_, err = Load(bad, noEnv)
	if want := bad + `:2: log.format: invalid value "xml" (use json, text)`; err == nil || err.Error() != want {
		t.Fatalf("Load(bad) = %v; want %s", err, want)
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"), noEnv)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load(missing) = %v; want fs.ErrNotExist", err)
	}
}

func TestDidYouMean(t *testing.T) {
	keys := []string{"socket", "http_addr", "auth_token_file", "tools", "dns", "deny", "memory", "max_memory"}
	tests := []struct {
		word, want string
	}{
		{"htp_addr", "http_addr"},
		{"http-addr", "http_addr"},
		{"HTTP_ADDR", "http_addr"},
		{"dsn", "dns"}, // transposition
		{"tool", "tools"},
		{"memroy", "memory"},
		{"max_mem", ""}, // too far from max_memory to be a typo
		{"colour", ""},
		{"x", ""},
	}
	for _, tt := range tests {
		got := didYouMean(tt.word, keys)
		want := ""
		if tt.want != "" {
			want = ` (did you mean "` + tt.want + `"?)`
		}
		if got != want {
			t.Errorf("didYouMean(%q) = %q, want %q", tt.word, got, want)
		}
	}
}

func TestNonDefault(t *testing.T) {
	c := Default()
	if got := c.NonDefault("network"); len(got) != 0 {
		t.Fatalf("defaults: %v", got)
	}
	c.Network.DefaultMode = "egress"
	c.Network.Deny = nil
	c.VM.MaxVMs = 3
	if got := c.NonDefault("network"); !slices.Equal(got, []string{"network.default_mode", "network.deny"}) {
		t.Fatalf("NonDefault(network) = %v", got)
	}
	if got := c.NonDefault("vm"); !slices.Equal(got, []string{"vm.max_vms"}) {
		t.Fatalf("NonDefault(vm) = %v", got)
	}
	if got := c.NonDefault("nosuchsection"); got != nil {
		t.Fatalf("NonDefault(nosuchsection) = %v", got)
	}
}
