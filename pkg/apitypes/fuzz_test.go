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

// TestProgressParams: the params map a progress notification carries
// names every member of ProgressMessage, spelled as its JSON tags.
func TestProgressParams(t *testing.T) {
	p := ProgressMessage{ProgressToken: "t", Progress: 3, Message: "m"}.Params()
	b, err := json.Marshal(ProgressMessage{ProgressToken: "t", Progress: 3, Message: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	// Both as maps: encoding/json writes map keys sorted.
	got, _ := json.Marshal(p)
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) {
		t.Errorf("Params() = %s, want %s", got, wantJSON)
	}
}
