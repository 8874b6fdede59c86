package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// twoKeys authenticates an admin key and a user key.
type twoKeys struct{}

func (twoKeys) Authenticate(secret, _ string) (principal.Principal, error) {
	switch secret {
	case "admin-secret":
		return principal.Principal{KeyID: "key-admin", KeyName: "ops", Tenant: "admin", Admin: true}, nil
	case "user-secret":
		return principal.Principal{KeyID: "key-user", KeyName: "ci", Tenant: "alice"}, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("unknown key")
}

func (twoKeys) Valid(string) bool { return true }

// TestDebugProfiles: GET /v1/debug/pprof/{profile} gives an admin the
// daemon's profiles in the formats Go's tools read, refuses a user key,
// and answers bad names and bounds with the contract's error naming them.
func TestDebugProfiles(t *testing.T) {
	hs := httptest.NewServer(NewHandler(&fakeEngine{}, Options{Auth: twoKeys{}}))
	t.Cleanup(hs.Close)
	get := func(t *testing.T, key, path string) (*http.Response, []byte) {
		t.Helper()
		return doAs(t, hs, key, http.MethodGet, path, "")
	}
	wantError := func(t *testing.T, path string, status int, code errdefs.Code, names string) {
		t.Helper()
		resp, b := get(t, "admin-secret", path)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if resp.StatusCode != status || json.Unmarshal(b, &e) != nil || e.Error.Code != string(code) || !strings.Contains(e.Error.Message, names) {
			t.Errorf("GET %s: %d %s, want %d %s naming %q", path, resp.StatusCode, b, status, code, names)
		}
	}

	t.Run("a user key is refused", func(t *testing.T) {
		for _, p := range []string{"/v1/debug/pprof/heap", "/v1/debug/pprof/trace?seconds=1"} {
			if resp, b := get(t, "user-secret", p); resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), `"permission_denied"`) {
				t.Errorf("GET %s with a user key: %d %s, want 403 permission_denied", p, resp.StatusCode, b)
			}
		}
	})
	t.Run("heap, binary", func(t *testing.T) {
		resp, b := get(t, "admin-secret", "/v1/debug/pprof/heap")
		// A profile.proto, gzipped.
		if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
			t.Fatalf("heap profile: %d %q", resp.StatusCode, b[:min(len(b), 64)])
		}
	})
	t.Run("goroutines, text", func(t *testing.T) {
		resp, b := get(t, "admin-secret", "/v1/debug/pprof/goroutine?debug=2")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "goroutine ") || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("goroutine dump: %d %s %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	})
	t.Run("an execution trace of one second", func(t *testing.T) {
		t0 := time.Now()
		resp, b := get(t, "admin-secret", "/v1/debug/pprof/trace?seconds=1")
		if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(b, []byte("go 1.")) {
			t.Fatalf("trace: %d %q", resp.StatusCode, b[:min(len(b), 64)])
		}
		if d := time.Since(t0); d < time.Second {
			t.Errorf("a 1-second trace answered after %v", d)
		}
	})
	t.Run("one trace at a time", func(t *testing.T) {
		var wg sync.WaitGroup
		started := make(chan struct{})
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, hs.URL+"/v1/debug/pprof/trace?seconds=2", nil)
			req.Header.Set("Authorization", "Bearer admin-secret")
			resp, err := hs.Client().Do(req)
			close(started) // headers are sent once the trace runs
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		<-started
		wantError(t, "/v1/debug/pprof/trace?seconds=1", http.StatusConflict, errdefs.Conflict, "one at a time")
		wg.Wait()
	})
	t.Run("a caller leaving ends the profile", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/v1/debug/pprof/profile?seconds=60", nil)
		req.Header.Set("Authorization", "Bearer admin-secret")
		if resp, err := hs.Client().Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		// The CPU profile stopped with the request: the next one starts.
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, b := get(t, "admin-secret", "/v1/debug/pprof/profile?seconds=1")
			if resp.StatusCode == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a CPU profile after the caller of a 60-second one left: %d %s", resp.StatusCode, b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		wantError(t, "/v1/debug/pprof/cmdline", http.StatusNotFound, errdefs.NotFound, `profile "cmdline"`)
		wantError(t, "/v1/debug/pprof/..%2fheap", http.StatusNotFound, errdefs.NotFound, "profile")
		for _, v := range []string{"0", "61", "-1", "x", "1.5"} {
			wantError(t, "/v1/debug/pprof/trace?seconds="+v, http.StatusBadRequest, errdefs.InvalidArgument, "seconds")
			wantError(t, "/v1/debug/pprof/profile?seconds="+v, http.StatusBadRequest, errdefs.InvalidArgument, "seconds")
		}
		wantError(t, "/v1/debug/pprof/heap?debug=3", http.StatusBadRequest, errdefs.InvalidArgument, "debug")
		wantError(t, "/v1/debug/pprof/heap?debug=x", http.StatusBadRequest, errdefs.InvalidArgument, "debug")
	})
}
