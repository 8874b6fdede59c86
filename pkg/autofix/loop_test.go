package autofix

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// fakeRunner "runs" programs by reading them: a line "ERR:msg" makes the
// run step exit 1 with msg on stderr, "WARN:msg" exits 0 with msg on
// stderr, "TESTFAIL" fails the test step. It stands in for the engine's
// pipeline in the loop's unit tests; the engine's tests run the loop on
// real sandboxes.
type fakeRunner struct {
	mu    sync.Mutex
	calls []AttemptRequest
	delay time.Duration
}

func (r *fakeRunner) RunAttempt(ctx context.Context, req AttemptRequest) (*apitypes.RunResult, error) {
	r.mu.Lock()
	r.calls = append(r.calls, req)
	r.mu.Unlock()
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res := &apitypes.RunResult{RunID: "run", SandboxID: "sb", Language: "python"}
	step := func(name string, code int, stderr string) {
		st := apitypes.RunStep{Name: name, ExitCode: code, Stderr: stderr, Termination: apitypes.Termination{Cause: apitypes.CauseExited}}
		res.Steps = append(res.Steps, st)
		res.ExitCode, res.Stderr, res.Termination = code, stderr, st.Termination
	}
	if req.Install {
		step(StepInstall, 0, "")
	}
	code, stderr := 0, ""
	for _, name := range req.Files.Names() {
		for _, line := range strings.Split(string(req.Files[name]), "\n") {
			if msg, ok := strings.CutPrefix(line, "ERR:"); ok {
				code, stderr = 1, stderr+msg+"\n"
			}
			if msg, ok := strings.CutPrefix(line, "WARN:"); ok {
				stderr += msg + "\n"
			}
		}
	}
	step(StepRun, code, stderr)
	if req.Test && code == 0 {
		tc := 0
		for _, f := range req.Files {
			if strings.Contains(string(f), "TESTFAIL") {
				tc = 1
			}
		}
		step(StepTest, tc, "")
	}
	res.Success = code == 0
	return res, nil
}

// scripted answers from a list, one per call.
type scripted struct {
	answers []string
	reqs    []*FixRequest
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Fix(_ context.Context, req *FixRequest) (*Answer, error) {
	s.reqs = append(s.reqs, req)
	if len(s.reqs) > len(s.answers) {
		return nil, fmt.Errorf("unexpected fix request %d", len(s.reqs))
	}
	return &Answer{Text: s.answers[len(s.reqs)-1], Usage: &apitypes.TokenUsage{InputTokens: 10, OutputTokens: 2}}, nil
}

func newLoopState(t *testing.T, files Files, p Params, maxRetries *int) *State {
	t.Helper()
	p.Language, p.Entrypoint = "python", "main.py"
	if err := p.Validate(maxRetries, 0); err != nil {
		t.Fatal(err)
	}
	return NewState("af-test", "run-test", p, files)
}

func TestLoopFixesAfterTwoFixes(t *testing.T) {
	r := &fakeRunner{}
	prov := &scripted{answers: []string{
		"```python main.py\nERR:TypeError: still wrong\n```\n",
		"--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-ERR:TypeError: still wrong\n+print(1)\n",
	}}
	var events []apitypes.AutofixEvent
	l := &Loop{Runner: r, Provider: prov, OnEvent: func(e apitypes.AutofixEvent) { events = append(events, e) }}
	st := newLoopState(t, Files{"main.py": []byte("ERR:NameError: name 'x' is not defined\n")}, Params{}, nil)
	if err := l.Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	res := st.Result()
	if !res.Success || res.Status != apitypes.AutofixFixed || res.Attempts != 3 || res.StopReason != apitypes.StopSuccess {
		t.Fatalf("result = %+v", res)
	}
	if len(st.Records) != 3 || st.Records[0].Fix == "" || st.Records[1].Fix == "" || st.Records[2].Fix != "" {
		t.Fatalf("records = %+v", st.Records)
	}
	if !strings.Contains(st.Records[0].Error, "NameError") || st.Records[0].Provider != "scripted" || st.Records[0].Tokens == nil {
		t.Fatalf("record 1 = %+v", st.Records[0])
	}
	if !strings.Contains(st.Records[1].Fix, "-ERR:TypeError") || !strings.Contains(st.Records[1].Fix, "+print(1)") {
		t.Fatalf("record 2 fix = %q", st.Records[1].Fix)
	}
	// The second request tells the fixer about the first attempt.
	if len(prov.reqs[1].Earlier) != 1 || !strings.Contains(prov.reqs[1].Earlier[0], "NameError") || !strings.Contains(prov.reqs[1].Earlier[0], "main.py +1 -1") {
		t.Fatalf("earlier = %q", prov.reqs[1].Earlier)
	}
	if p := prov.reqs[0].Prompt(); !strings.Contains(p, "NameError") || !strings.Contains(p, "python main.py") || !strings.Contains(p, "Attempt 1 of at most 6") {
		t.Fatalf("prompt:\n%s", p)
	}
	if res.Diff != "--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-ERR:NameError: name 'x' is not defined\n+print(1)\n" {
		t.Fatalf("diff = %q", res.Diff)
	}
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
	}
	if got := strings.Join(types, " "); got != "attempt fix attempt fix attempt result" {
		t.Fatalf("events = %s", got)
	}
	// Install ran on attempt 1 only (no dependency file changed).
	if !r.calls[0].Install || r.calls[1].Install || r.calls[2].Install {
		t.Fatalf("install flags: %v %v %v", r.calls[0].Install, r.calls[1].Install, r.calls[2].Install)
	}
}

func TestLoopReinstallsWhenDependenciesChange(t *testing.T) {
	r := &fakeRunner{}
	prov := &scripted{answers: []string{"```text requirements.txt\nflask\n```\n```python main.py\nimport flask\n```\n"}}
	st := newLoopState(t, Files{"main.py": []byte("ERR:ModuleNotFoundError: No module named 'flask'\n"), "requirements.txt": []byte("\n")}, Params{}, nil)
	if err := (&Loop{Runner: r, Provider: prov}).Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if st.Status != apitypes.AutofixFixed || len(r.calls) != 2 || !r.calls[1].Install {
		t.Fatalf("status %s, calls %d, install %v", st.Status, len(r.calls), r.calls[len(r.calls)-1].Install)
	}
	if got := strings.Join(r.calls[1].Changed, ","); got != "main.py,requirements.txt" {
		t.Fatalf("changed = %s", got)
	}
}

func TestLoopStops(t *testing.T) {
	broken := Files{"main.py": []byte("ERR:boom\n")}
	two := 2
	t.Run("max_retries", func(t *testing.T) {
		prov := &scripted{answers: []string{"ERR:boom 1", "ERR:boom 2"}}
		st := newLoopState(t, broken, Params{}, &two)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.Status != apitypes.AutofixFailed || st.StopReason != apitypes.StopMaxRetries || len(st.Attempts) != 3 {
			t.Fatalf("status %s %s after %d attempts", st.Status, st.StopReason, len(st.Attempts))
		}
	})
	t.Run("no change", func(t *testing.T) {
		prov := &scripted{answers: []string{"ERR:boom\n"}}
		st := newLoopState(t, broken, Params{}, nil)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.StopReason != apitypes.StopNoChange || len(st.Attempts) != 1 || !strings.Contains(st.Error, "unchanged") {
			t.Fatalf("stop %s (%s) after %d attempts", st.StopReason, st.Error, len(st.Attempts))
		}
	})
	t.Run("same error with the same code", func(t *testing.T) {
		// A → B → A: the third attempt runs attempt 1's code again.
		prov := &scripted{answers: []string{"ERR:other\n", "ERR:boom\n"}}
		st := newLoopState(t, broken, Params{}, nil)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.StopReason != apitypes.StopRepeatedError || len(st.Attempts) != 3 {
			t.Fatalf("stop %s after %d attempts", st.StopReason, len(st.Attempts))
		}
	})
	t.Run("refused answers are recorded and count", func(t *testing.T) {
		prov := &scripted{answers: []string{
			"--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-nothing like this\n+print(1)\n",
			"```sh /etc/passwd\nx\n```\n",
		}}
		st := newLoopState(t, broken, Params{}, &two)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: prov}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.StopReason != apitypes.StopMaxRetries || len(st.Attempts) != 1 {
			t.Fatalf("stop %s after %d attempts", st.StopReason, len(st.Attempts))
		}
		rec := st.Records[0]
		if !strings.Contains(rec.Refused, "does not apply") || !strings.Contains(rec.Refused, "outside /workspace") || rec.Fix != "" {
			t.Fatalf("record = %+v", rec)
		}
		if !strings.Contains(prov.reqs[1].Prompt(), "could not be applied: the diff does not apply") {
			t.Fatalf("second prompt does not say why:\n%s", prov.reqs[1].Prompt())
		}
	})
	t.Run("provider error", func(t *testing.T) {
		st := newLoopState(t, broken, Params{}, nil)
		if err := (&Loop{Runner: &fakeRunner{}, Provider: &scripted{}}).Start(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if st.StopReason != apitypes.StopProviderError || !strings.Contains(st.Error, "unexpected fix request") {
			t.Fatalf("stop %s: %s", st.StopReason, st.Error)
		}
	})
}

func TestSuccessRules(t *testing.T) {
	for _, tc := range []struct {
		rule, code string
		ok         bool
	}{
		{apitypes.SuccessExitZeroEmptyStderr, "print(1)\n", true},
		{apitypes.SuccessExitZeroEmptyStderr, "WARN:DeprecationWarning\n", false},
		{apitypes.SuccessExitZero, "WARN:DeprecationWarning\n", true},
		{apitypes.SuccessExitZero, "ERR:x\n", false},
		{apitypes.SuccessTests, "print(1)\n", true},
		{apitypes.SuccessTests, "print(1)\n# TESTFAIL\n", false},
	} {
		res, _ := (&fakeRunner{}).RunAttempt(context.Background(), AttemptRequest{Files: Files{"main.py": []byte(tc.code)}, Test: tc.rule == apitypes.SuccessTests})
		if got := Succeeded(tc.rule, res); got != tc.ok {
			t.Errorf("Succeeded(%s, %q) = %v", tc.rule, tc.code, got)
		}
	}
	// tests without a test step is not a success.
	res, _ := (&fakeRunner{}).RunAttempt(context.Background(), AttemptRequest{Files: Files{"main.py": []byte("1\n")}})
	if Succeeded(apitypes.SuccessTests, res) {
		t.Error("tests rule passed without a test step")
	}
}

func TestParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		p    Params
		max  *int
		cap  int
		want string
	}{
		{max: ptr(0), want: "max_retries: must be between 1 and 20, got 0"},
		{max: ptr(21), want: "max_retries: must be between 1 and 20, got 21"},
		{max: ptr(11), cap: 10, want: "max_retries: must be between 1 and 10, got 11"},
		{p: Params{Success: "pass"}, want: "success: must be"},
		{p: Params{TestCommand: "pytest"}, want: "test_command: only with success"},
		{max: ptr(20)},
		{p: Params{Success: apitypes.SuccessTests, TestCommand: "pytest -q"}},
	} {
		err := tc.p.Validate(tc.max, tc.cap)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v, %v) = %v, want %q", tc.p, tc.max, err, tc.want)
		}
	}
	var p Params
	if err := p.Validate(nil, 0); err != nil || p.MaxRetries != 5 || p.Timeout != 300*time.Second || p.Success != apitypes.SuccessExitZeroEmptyStderr {
		t.Errorf("defaults: %+v, %v", p, err)
	}
}

// The client provider: the loop stops at needs_fix; its state survives a
// JSON round trip (what the engine keeps in SQLite across a restart) and
// Submit continues it.
func TestLoopClientSession(t *testing.T) {
	r := &fakeRunner{}
	l := &Loop{Runner: r}
	st := newLoopState(t, Files{"main.py": []byte("ERR:NameError: x\n")}, Params{Provider: apitypes.ProviderClient}, nil)
	if err := l.Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	res := st.Result()
	if res.Status != apitypes.AutofixNeedsFix || res.Attempts != 1 || !strings.Contains(res.Prompt, "NameError") {
		t.Fatalf("result = %+v", res)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	// An unchanged submission is refused as no change.
	if err := l.Submit(context.Background(), &back, &Answer{Files: map[string]string{"main.py": "ERR:TypeError: y\n"}}, apitypes.ProviderClient); err != nil {
		t.Fatal(err)
	}
	if back.Status != apitypes.AutofixNeedsFix || len(back.Attempts) != 2 {
		t.Fatalf("after submit 1: %s, %d attempts", back.Status, len(back.Attempts))
	}
	if err := l.Submit(context.Background(), &back, &Answer{Files: map[string]string{"/workspace/main.py": "print(1)\n"}}, apitypes.ProviderClient); err != nil {
		t.Fatal(err)
	}
	if back.Status != apitypes.AutofixFixed || len(back.Attempts) != 3 || back.Records[0].Provider != "client" {
		t.Fatalf("after submit 2: %+v", back.Result())
	}
	if err := l.Submit(context.Background(), &back, &Answer{Text: "x"}, "client"); err == nil {
		t.Fatal("submit to a finished loop succeeded")
	}
}

func TestLoopTimeoutDuringAttempt(t *testing.T) {
	r := &fakeRunner{delay: 300 * time.Millisecond}
	st := newLoopState(t, Files{"main.py": []byte("ERR:x\n")}, Params{Timeout: 500 * time.Millisecond}, nil)
	prov := &scripted{answers: []string{"ERR:y\n", "ERR:z\n"}}
	start := time.Now()
	if err := (&Loop{Runner: r, Provider: prov}).Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if st.StopReason != apitypes.StopTimeout || time.Since(start) > 2*time.Second {
		t.Fatalf("stop %s after %v", st.StopReason, time.Since(start))
	}
}

// clientOnly is a provider that hands every request to the client.
type clientOnly struct{}

func (clientOnly) Name() string { return "sampling" }
func (clientOnly) Fix(context.Context, *FixRequest) (*Answer, error) {
	return nil, fmt.Errorf("sampling: not over this protocol: %w", ErrUseClient)
}

func TestLoopProviderFallsBackToClient(t *testing.T) {
	st := newLoopState(t, Files{"main.py": []byte("ERR:x\n")}, Params{Provider: "sampling"}, nil)
	l := &Loop{Runner: &fakeRunner{}, Provider: clientOnly{}}
	if err := l.Start(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if st.Status != apitypes.AutofixNeedsFix || st.Params.Provider != apitypes.ProviderClient || st.FixRequests != 0 || st.Pending == nil {
		t.Fatalf("state: %s provider %s requests %d", st.Status, st.Params.Provider, st.FixRequests)
	}
	if err := (&Loop{Runner: &fakeRunner{}}).Submit(context.Background(), st, &Answer{Text: "print(1)"}, "client"); err != nil || st.Status != apitypes.AutofixFixed {
		t.Fatalf("after submit: %s, %v", st.Status, err)
	}
}
