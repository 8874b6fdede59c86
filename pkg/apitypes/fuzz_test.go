package apitypes

import (
	"encoding/json"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// FuzzDecodeRequests: every request body either decodes or yields an
// invalid_argument error from DecodeError whose message names the body or a
// field, never a panic and never another class.
func FuzzDecodeRequests(f *testing.F) {
	for _, s := range []string{
		`{"language":"python","memory_mb":512}`, `{"memory_mb":"512"}`, `{"memory_mb":1e400}`,
		`{"argv":["ls","-l"],"env":{"A":"b"},"timeout_seconds":3}`, `{"argv":[1]}`, `[`, `{"seccomp_profile":"strict"}`,
		`{"files":{"main.py":"print(1)"},"code":"x"}`, `null`, `{"labels":{"a":null}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, v := range []any{&CreateSandboxRequest{}, &ExecRequest{}, &RunCodeRequest{}, &FileWriteRequest{}} {
			err := json.Unmarshal(data, v)
			if err == nil {
				continue
			}
			derr := DecodeError("body", err)
			if !errdefs.Is(derr, errdefs.InvalidArgument) {
				t.Fatalf("DecodeError(%v) = %v, want invalid_argument", err, derr)
			}
			if errdefs.MessageOf(derr) == "" {
				t.Fatalf("DecodeError(%v) has no message", err)
			}
		}
	})
}
