package config

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// Option adjusts how Load and Parse build a configuration.
type Option func(*options)

type options struct {
	lookupEnv func(string) (string, bool)
}

// WithLookupEnv makes Load and Parse read environment overrides through
// lookup instead of os.LookupEnv. A nil lookup disables overrides, which is
// what checking a file on its own (`config validate FILE`) wants.
func WithLookupEnv(lookup func(key string) (value string, ok bool)) Option {
	return func(o *options) { o.lookupEnv = lookup }
}

// Load reads the configuration file at path; see Parse. A missing file is an
// error that satisfies errors.Is(err, fs.ErrNotExist), so a caller may choose
// to fall back to Default().
func Load(path string, opts ...Option) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(data, path, opts)
}

// Parse builds a configuration from YAML: it starts from Default(), overlays
// the keys present in data, then the environment overrides
// SANDBOXD_<SECTION>_<KEY> (lists comma-separated, maps as k=v,k=v), then
// runs Validate. A YAML syntax error is returned as such; every other problem
// is reported, all at once, in a *ValidationError.
func Parse(data []byte, opts ...Option) (*Config, error) {
	return parse(data, "", opts)
}

func parse(data []byte, file string, opts []Option) (*Config, error) {
	o := options{lookupEnv: os.LookupEnv}
	for _, opt := range opts {
		opt(&o)
	}
	cfg := Default()
	v := reflect.ValueOf(cfg).Elem()
	d := &decoder{file: file, origin: make(map[string]string)}
	if err := d.document(data, v); err != nil {
		if file != "" {
			return nil, fmt.Errorf("parse %s: %w", file, err)
		}
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if o.lookupEnv != nil {
		d.environment(v, "", envPrefix, o.lookupEnv)
	}

	all := d.probs
	if verr, ok := cfg.Validate().(*ValidationError); ok {
		for _, fe := range verr.Errors {
			// A key that failed to decode kept its default, and checking that
			// default against its neighbours would only add noise.
			if reported(fe.Key, d.probs) {
				continue
			}
			fe.Source = d.locate(fe.Key)
			all = append(all, fe)
		}
	}
	if err := all.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// reported reports whether key, or a key above or below it, already has a
// problem in probs.
func reported(key string, probs problems) bool {
	for _, p := range probs {
		if related(key, p.Key) || related(p.Key, key) {
			return true
		}
	}
	return false
}

// related reports whether key is ancestor or equal to other.
func related(key, other string) bool {
	return key == other || strings.HasPrefix(other, key+".") || strings.HasPrefix(other, key+"[")
}

// locate returns where the value of key, or of the nearest key above it, was
// set; "" when it is a default.
func (d *decoder) locate(key string) string {
	for k := key; k != ""; k = parentKey(k) {
		if at, ok := d.origin[k]; ok {
			return at
		}
	}
	return ""
}

// Marshal encodes c as YAML, without comments: the effective configuration,
// as `mcp-sandboxd config` prints it. The output parses back to c.
func Marshal(c *Config) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("marshal config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("marshal config: %w", err)
	}
	return buf.Bytes(), nil
}
