package config

import (
	"testing"
)

// FuzzParse: any input is either a configuration that validates or an
// error; never a panic, and a config Parse accepts survives Marshal and
// Parse again unchanged in meaning.
func FuzzParse(f *testing.F) {
	f.Add([]byte(DefaultYAML))
	f.Add([]byte("sandbox:\n  memory: 512M\n  seccomp_rules: {default: [{names: [ptrace], action: SCMP_ACT_ERRNO, errno_ret: 1}]}\n"))
	f.Add([]byte("server: {max_request_bytes: 1G}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("sandbox:\n  cpus: .nan\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			return
		}
		out, err := Marshal(cfg)
		if err != nil {
			t.Fatalf("Marshal of a parsed config: %v", err)
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("re-parse of a marshalled config: %v\n%s", err, out)
		}
	})
}
