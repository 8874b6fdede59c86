package autofix

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Command providers that misbehave in the three ways the loop must survive,
// as real processes.
func TestCommandProviderStops(t *testing.T) {
	broken := Files{"main.py": []byte("ERR:boom\n")}
	t.Run("never fixes: stops at max_retries", func(t *testing.T) {
		// A different, still failing answer every time.
		prov := &CommandProvider{Argv: []string{"/bin/sh", "-c", `cat >/dev/null; echo "ERR:boom $(date +%s%N)"`}}
		three := 3
		st := newLoopState(t, broken, Params{}, &three)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.Status != apitypes.AutofixFailed || st.StopReason != apitypes.StopMaxRetries || len(st.Attempts) != 4 || st.Result().Success {
			t.Fatalf("%s %s after %d attempts", st.Status, st.StopReason, len(st.Attempts))
		}
		for _, r := range st.Records[:3] {
			if r.Provider != "command" || r.Fix == "" {
				t.Fatalf("record %+v", r)
			}
		}
	})
	t.Run("hangs: stops at the timeout", func(t *testing.T) {
		// The shell's child (sleep) holds stdout open: the whole process
		// group must be killed for the call to return.
		prov := &CommandProvider{Argv: []string{"/bin/sh", "-c", "sleep 60; echo print"}}
		st := newLoopState(t, broken, Params{Timeout: time.Second}, nil)
		start := time.Now()
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); st.StopReason != apitypes.StopTimeout || el > 4*time.Second {
			t.Fatalf("stop %s after %v", st.StopReason, el)
		}
		if !strings.Contains(st.Error, "ran out") {
			t.Fatalf("error %q", st.Error)
		}
	})
	t.Run("same code: stops at once", func(t *testing.T) {
		prov := &CommandProvider{Argv: []string{"/bin/sh", "-c", `cat >/dev/null; printf 'ERR:boom\n'`}}
		st := newLoopState(t, broken, Params{}, nil)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.StopReason != apitypes.StopNoChange || len(st.Attempts) != 1 || !strings.Contains(st.Error, "unchanged") {
			t.Fatalf("stop %s after %d attempts: %s", st.StopReason, len(st.Attempts), st.Error)
		}
	})
	t.Run("gets the prompt on stdin", func(t *testing.T) {
		dir := t.TempDir()
		prov := &CommandProvider{Argv: []string{"/bin/sh", "-c", "cat > " + filepath.Join(dir, "prompt") + "; echo 'print(1)'"}}
		st := newLoopState(t, broken, Params{}, nil)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "prompt"))
		if st.Status != apitypes.AutofixFixed || !bytes.Contains(b, []byte("ERR:boom")) || !bytes.Contains(b, []byte("exit code 1")) {
			t.Fatalf("status %s, prompt:\n%s", st.Status, b)
		}
	})
	t.Run("failing command", func(t *testing.T) {
		prov := &CommandProvider{Argv: []string{"/bin/sh", "-c", "echo 'no credits' >&2; exit 3"}}
		st := newLoopState(t, broken, Params{}, nil)
		_ = (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st)
		if st.StopReason != apitypes.StopProviderError || !strings.Contains(st.Error, "no credits") {
			t.Fatalf("stop %s: %s", st.StopReason, st.Error)
		}
	})
}

// fakeMessages is a local stand-in for the Messages API: it checks what
// the SDK sends, answers 429 with retry-after first, then a fix.
type fakeMessages struct {
	mu       sync.Mutex // the handler runs on the server's goroutines
	t        *testing.T
	key      string
	calls    atomic.Int32
	first429 bool
	answer   string
	last     map[string]any
	headers  http.Header
	times    []time.Time
}

func (f *fakeMessages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.calls.Add(1)
	f.times = append(f.times, time.Now())
	if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
		http.Error(w, "not found", 404)
		return
	}
	if r.Header.Get("x-api-key") != f.key {
		w.WriteHeader(401)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`)
		return
	}
	if f.first429 && n == 1 {
		w.Header().Set("retry-after", "1")
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(429)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
		return
	}
	f.headers = r.Header.Clone()
	body, _ := io.ReadAll(r.Body)
	f.last = map[string]any{}
	_ = json.Unmarshal(body, &f.last)
	w.Header().Set("content-type", "application/json")
	resp := map[string]any{
		"id": "msg_1", "type": "message", "role": "assistant", "model": f.last["model"],
		"content":     []any{map[string]any{"type": "text", "text": f.answer}},
		"stop_reason": "end_turn", "usage": map[string]any{"input_tokens": 321, "output_tokens": 45},
	}
	_ = json.NewEncoder(w).Encode(resp)
}

func TestAnthropicProvider(t *testing.T) {
	const key = "sk-ant-test-0123456789-SECRET"
	fake := &fakeMessages{t: t, key: key, first429: true, answer: "```python main.py\nprint(1)\n```\n"}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prov := &AnthropicProvider{Model: "claude-test-model", BaseURL: srv.URL, MaxTokens: 1234, KeyFile: keyFile}
	r := &fakeRunner{}
	st := newLoopState(t, Files{"main.py": []byte("ERR:NameError: name 'x' is not defined\n")}, Params{Provider: "anthropic"}, nil)
	l := &Loop{Runner: r, Provider: prov, OnEvent: func(e apitypes.AutofixEvent) { log.Info("autofix event", "event", e) }}
	if err := l.Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	log.Info("autofix done", "state", st)
	if st.Status != apitypes.AutofixFixed || len(st.Attempts) != 2 {
		t.Fatalf("%s after %d attempts: %s", st.Status, len(st.Attempts), st.Error)
	}
	// 429 then success, the retry after the announced second.
	if fake.calls.Load() != 2 || fake.times[1].Sub(fake.times[0]) < 900*time.Millisecond {
		t.Fatalf("calls %d at %v", fake.calls.Load(), fake.times)
	}
	if fake.last["model"] != "claude-test-model" || fake.last["max_tokens"] != float64(1234) {
		t.Fatalf("request = %v", fake.last)
	}
	msgs, _ := fake.last["messages"].([]any)
	if len(msgs) != 1 || !strings.Contains(mustJSON(t, msgs[0]), "NameError") || !strings.Contains(mustJSON(t, msgs[0]), `"role":"user"`) {
		t.Fatalf("messages = %v", msgs)
	}
	if fake.headers.Get("anthropic-version") == "" || fake.headers.Get("x-api-key") != key {
		t.Fatalf("headers = %v", fake.headers)
	}
	u := st.Records[0].Tokens
	if u == nil || u.InputTokens != 321 || u.OutputTokens != 45 || st.Attempts[0].Tokens.InputTokens != 321 {
		t.Fatalf("tokens = %+v", u)
	}
	// The key is nowhere in what the loop produced or logged.
	state := mustJSON(t, st)
	for what, s := range map[string]string{"logs": logs.String(), "state": state, "result": mustJSON(t, st.Result()), "prompt": st.Records[0].Error} {
		if strings.Contains(s, key) || strings.Contains(s, "SECRET") {
			t.Errorf("the API key appears in the %s", what)
		}
	}
	for _, req := range r.calls {
		for name, f := range req.Files {
			if bytes.Contains(f, []byte(key)) {
				t.Errorf("the API key is in the sandbox file %s", name)
			}
		}
	}
}

func TestAnthropicProviderErrors(t *testing.T) {
	const key = "sk-ant-wrong-key-SECRET"
	fake := &fakeMessages{t: t, key: "another"}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	t.Setenv("SANDBOXD_TEST_ANTHROPIC_KEY", key)
	prov := &AnthropicProvider{BaseURL: srv.URL, KeyEnv: "SANDBOXD_TEST_ANTHROPIC_KEY", MaxRetries: -1}
	_, err := prov.Fix(context.Background(), &FixRequest{Language: "python", Entrypoint: "main.py", Files: Files{"main.py": []byte("x\n")}})
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), key) {
		t.Fatalf("err = %v", err)
	}
	prov = &AnthropicProvider{BaseURL: srv.URL, KeyEnv: "SANDBOXD_TEST_NO_SUCH_VARIABLE"}
	if err := prov.Configured(); err == nil || !strings.Contains(err.Error(), "SANDBOXD_TEST_NO_SUCH_VARIABLE") {
		t.Fatalf("Configured = %v", err)
	}
	// 5xx is retried too.
	var calls atomic.Int32
	srv5 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("retry-after-ms", "10")
			w.WriteHeader(503)
			return
		}
		fake.mu.Lock()
		fake.key = key
		fake.answer = "print(1)"
		fake.mu.Unlock()
		fake.ServeHTTP(w, r)
	}))
	defer srv5.Close()
	prov = &AnthropicProvider{BaseURL: srv5.URL, KeyEnv: "SANDBOXD_TEST_ANTHROPIC_KEY"}
	ans, err := prov.Fix(context.Background(), &FixRequest{Language: "python", Entrypoint: "main.py", Files: Files{"main.py": []byte("x\n")}})
	if err != nil || ans.Text != "print(1)" || calls.Load() != 2 {
		t.Fatalf("after a 503: %v, %+v, %d calls", err, ans, calls.Load())
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
