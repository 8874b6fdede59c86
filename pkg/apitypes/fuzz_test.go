package apitypes

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

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

// FuzzTemplateCreate: a template_create body (POST /v1/templates) either
// decodes, or is invalid_argument from DecodeError; a decoded one that
// CheckTemplate accepts keeps the bounds the engine relies on when it
// starts the template's sandboxes (a readiness wait of 0 to 600 s, a port
// in 1-65535, a pool within the bound) and comes back unchanged from the
// JSON the engine stores it as; one it refuses is invalid_argument naming
// a field of the request.
func FuzzTemplateCreate(f *testing.F) {
	for _, s := range []string{
		`{"name":"web","image":"python","start_command":"python3 -m http.server 8000","ready":{"port":8000,"timeout_seconds":30},"memory_mb":256,"env":{"A":"b"},"pool":2}`,
		`{"name":"w","image":"node","start_command":"node s.js","ready":{"command":"curl -sf localhost:3000","timeout_seconds":600}}`,
		`{"name":"x","image":"python","ready":{"command":"true"},"network":"allowlist","allow":["example.com"]}`,
		`{"name":"x","image":"python","start_command":"s","ready":{"port":70000}}`,
		`{"name":"x","image":"python","start_command":"s","ready":{"port":1,"timeout_seconds":-1}}`,
		`{"name":"x","image":"python","pool":-1}`, `{"ready":null}`, `{"ready":{"port":"80"}}`,
	} {
		f.Add([]byte(s))
	}
	const maxPool = 100
	f.Fuzz(func(t *testing.T, data []byte) {
		var req TemplateCreateRequest
		if err := json.Unmarshal(data, &req); err != nil {
			if derr := DecodeError("body", err); !errdefs.Is(derr, errdefs.InvalidArgument) {
				t.Fatalf("DecodeError(%v) = %v, want invalid_argument", err, derr)
			}
			return
		}
		err := CheckTemplate(&req, maxPool)
		if err != nil {
			field, _, _ := strings.Cut(errdefs.MessageOf(err), ":")
			if !errdefs.Is(err, errdefs.InvalidArgument) || !templateFields[strings.Split(field, ".")[0]] {
				t.Fatalf("CheckTemplate(%s) = %v, want invalid_argument naming a field", data, err)
			}
			return
		}
		if r := req.Ready; r != nil {
			if r.TimeoutSeconds < 0 || r.TimeoutSeconds > int64(MaxReadyTimeout/time.Second) {
				t.Fatalf("accepted ready.timeout_seconds %d", r.TimeoutSeconds)
			}
			if r.Port < 0 || r.Port > 65535 || (r.Port == 0) == (r.Command == "") {
				t.Fatalf("accepted ready %+v", *r)
			}
		} else if req.StartCommand != "" {
			t.Fatalf("accepted a start_command without ready: %s", data)
		}
		if req.Pool < 0 || req.Pool > maxPool {
			t.Fatalf("accepted pool %d", req.Pool)
		}
		stored, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("accepted %s does not encode: %v", data, err)
		}
		var back TemplateCreateRequest
		if err := json.Unmarshal(stored, &back); err != nil || !reflect.DeepEqual(normalTemplate(req), normalTemplate(back)) {
			t.Fatalf("%s stored as %s reads back as %+v (%v)", data, stored, back, err)
		}
	})
}

// templateFields are the JSON names of TemplateCreateRequest's fields.
var templateFields = map[string]bool{"name": true, "image": true, "start_command": true, "ready": true, "memory_mb": true,
	"cpus": true, "disk_mb": true, "network": true, "allow": true, "env": true, "pool": true}

// normalTemplate makes empty maps and slices nil: omitempty drops them,
// and the engine treats both alike.
func normalTemplate(t TemplateCreateRequest) TemplateCreateRequest {
	if len(t.Env) == 0 {
		t.Env = nil
	}
	if len(t.Allow) == 0 {
		t.Allow = nil
	}
	return t
}
