// Package autofix is the run → fix → run again loop: it runs a program
// (through a Runner: the engine's run pipeline, one sandbox kept across
// attempts), and while the program fails it asks a Provider for a fix,
// applies the answer (a unified diff or whole files) and runs again, until
// the program meets its success rule or the loop runs out of retries, time
// or progress.
//
// attempts counts runs: the original code is attempt 1, so a program fixed
// by the first fix succeeds at attempt 2. max_retries bounds the fix
// requests, so a loop makes at most max_retries+1 runs.
//
// The loop's whole state is a State, a plain value that serialises to JSON:
// with the client provider (no model on the server) the loop stops at
// status needs_fix, the engine keeps the State in SQLite, and Submit
// continues it when the MCP client answers — in the same daemon or the next.
package autofix

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Bounds of the loop's parameters (autofix.max_retries_cap in the config
// may lower MaxRetriesCap).
const (
	DefaultMaxRetries = 5
	MaxRetriesCap     = 20
	DefaultTimeout    = 300 * time.Second
)

// Runner runs one attempt: it writes the files into the loop's sandbox
// (the same one for every attempt), runs the language's steps — install
// when asked, compile, run, and the test step when asked — and keeps the
// attempt's code snapshot and output in the run record. A non-nil error
// means the attempt could not be run at all (the sandbox died, the
// daemon is shutting down); a program that fails is a result.
type Runner interface {
	RunAttempt(ctx context.Context, req AttemptRequest) (*apitypes.RunResult, error)
}

// AttemptRequest is one attempt for a Runner.
type AttemptRequest struct {
	Attempt    int
	Files      Files
	Entrypoint string
	// Install asks for the dependency installers: on attempt 1, and when
	// a fix changed a dependency file.
	Install bool
	// Changed lists the files changed since the previous attempt (all of
	// them on attempt 1); Removed those the fix deleted.
	Changed []string
	Removed []string
	// Test asks for the test step after the program ran successfully
	// (success rule tests): TestCommand (sh -c) or the language's test task.
	Test        bool
	TestCommand string
	// Deadline is the end of the loop's time.
	Deadline time.Time
}

// Step names the loop reads in a Runner's results (the pipeline's steps,
// plus the test step of the tests rule).
const (
	StepInstall = "install"
	StepCompile = "compile"
	StepRun     = "run"
	StepTest    = "test"
)

// Answer is a provider's fix.
type Answer struct {
	// Text is the answer as the provider gave it (Apply reads it), unless
	// Files is set: whole files by path (the client's autofix_submit).
	Text  string
	Files map[string]string
	Usage *apitypes.TokenUsage
}

// ErrUseClient, returned (wrapped) by a provider's Fix, hands the fix
// request to the client: the loop parks at needs_fix as with the client
// provider.
var ErrUseClient = errors.New("the client must answer this fix request")

// Provider writes fixes. Fix is called with the loop's remaining time in
// ctx's deadline and must give up when ctx ends.
type Provider interface {
	Name() string
	Fix(ctx context.Context, req *FixRequest) (*Answer, error)
}

// dependencyFiles are the manifests whose change makes the loop install
// the dependencies again (matched by base name).
var dependencyFiles = []string{
	"requirements.txt", "pyproject.toml", "setup.py", "setup.cfg",
	"package.json", "package-lock.json", "go.mod", "go.sum", "Cargo.toml", "Cargo.lock",
}

// IsDependencyFile reports whether a change to name calls for installing
// the dependencies again.
func IsDependencyFile(name string) bool {
	b := path.Base(name)
	return slices.Contains(dependencyFiles, b) || (strings.HasPrefix(b, "requirements") && strings.HasSuffix(b, ".txt"))
}

// Params are a loop's parameters, already validated (Validate).
type Params struct {
	Language    string
	Entrypoint  string
	MaxRetries  int
	Timeout     time.Duration
	Success     string
	TestCommand string
	Provider    string
}

// Validate checks p against the caps and fills in the defaults. Errors
// name the request field.
func (p *Params) Validate(maxRetries *int, maxCap int) error {
	if maxCap <= 0 || maxCap > MaxRetriesCap {
		maxCap = MaxRetriesCap
	}
	if maxRetries != nil {
		if *maxRetries < 1 || *maxRetries > maxCap {
			return fmt.Errorf("max_retries: must be between 1 and %d, got %d", maxCap, *maxRetries)
		}
		p.MaxRetries = *maxRetries
	}
	if p.MaxRetries <= 0 {
		p.MaxRetries = DefaultMaxRetries
	}
	if p.MaxRetries > maxCap {
		p.MaxRetries = maxCap
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultTimeout
	}
	switch p.Success {
	case "":
		p.Success = apitypes.SuccessExitZeroEmptyStderr
	case apitypes.SuccessExitZeroEmptyStderr, apitypes.SuccessExitZero, apitypes.SuccessTests:
	default:
		return fmt.Errorf("success: must be %s, %s or %s, got %q", apitypes.SuccessExitZeroEmptyStderr, apitypes.SuccessExitZero, apitypes.SuccessTests, p.Success)
	}
	if p.TestCommand != "" && p.Success != apitypes.SuccessTests {
		return fmt.Errorf("test_command: only with success %q", apitypes.SuccessTests)
	}
	return nil
}

// State is a loop in progress or finished. It is plain data (JSON): the
// engine stores it between the calls of a client-provider session.
type State struct {
	ID     string `json:"id"`
	RunID  string `json:"run_id"`
	Params Params `json:"params"`

	Original Files `json:"original"`
	Current  Files `json:"current"`

	Status     string `json:"status"`
	StopReason string `json:"stop_reason,omitempty"`
	Error      string `json:"error,omitempty"`

	// Attempts are the runs so far; Records the fixed_attempts.json
	// entries (one per run).
	Attempts []apitypes.AutofixAttempt `json:"attempts"`
	Records  []apitypes.FixedAttempt   `json:"records"`
	Last     *apitypes.RunResult       `json:"last,omitempty"`

	// FixRequests counts the provider's answers (max_retries bounds it).
	FixRequests int `json:"fix_requests"`
	// Used is the loop's time spent so far (the client's thinking time
	// between needs_fix and autofix_submit does not count).
	Used time.Duration `json:"used"`
	// Seen are the (code, error) signatures of the failed attempts.
	Seen []string `json:"seen,omitempty"`
	// Pending is the fix request waiting for the client (needs_fix).
	Pending *FixRequest `json:"pending,omitempty"`
	// Refused says why the last answer could not be applied.
	Refused string `json:"refused,omitempty"`
}

// NewState starts a loop's state for the given files.
func NewState(id, runID string, p Params, files Files) *State {
	return &State{ID: id, RunID: runID, Params: p, Original: files.Clone(), Current: files.Clone(),
		Status: apitypes.AutofixRunning, Attempts: []apitypes.AutofixAttempt{}, Records: []apitypes.FixedAttempt{}}
}

// Done reports whether the loop has stopped for good.
func (s *State) Done() bool {
	return s.Status == apitypes.AutofixFixed || s.Status == apitypes.AutofixFailed || s.Status == apitypes.AutofixExpired
}

// Result is the answer the front ends give for the state.
func (s *State) Result() *apitypes.AutofixResult {
	r := &apitypes.AutofixResult{
		AutofixID: s.ID, RunID: s.RunID, Language: s.Params.Language, Status: s.Status,
		Success: s.Status == apitypes.AutofixFixed, StopReason: s.StopReason, Attempts: len(s.Attempts),
		MaxRetries: s.Params.MaxRetries, Provider: s.Params.Provider, Entrypoint: s.Params.Entrypoint,
		Files: map[string]string{}, Diff: UnifiedDiff(s.Original, s.Current), LastResult: s.Last,
		History: slices.Clone(s.Attempts), Error: s.Error, DurationMS: s.Used.Milliseconds(),
	}
	if s.Last != nil {
		r.SandboxID = s.Last.SandboxID
	}
	for k, v := range s.Current {
		r.Files[k] = string(v)
	}
	if s.Status == apitypes.AutofixNeedsFix && s.Pending != nil {
		r.Prompt = s.Pending.Prompt()
	}
	return r
}

// Loop drives a State with a Runner and a Provider.
type Loop struct {
	Runner Runner
	// Provider writes the fixes; nil is the client provider: the loop
	// stops at needs_fix with the request in State.Pending.
	Provider Provider
	// OnEvent, if set, sees every attempt and fix as it happens.
	OnEvent func(apitypes.AutofixEvent)
	// OnProgress, if set, is called after every change of the state (the
	// engine rewrites fixed_attempts.json there).
	OnProgress func(*State)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (l *Loop) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Start runs attempt 1 and goes on until the loop stops (or needs the
// client's fix).
func (l *Loop) Start(ctx context.Context, st *State) error {
	return l.timed(ctx, st, func(ctx context.Context, deadline time.Time) error {
		if stop, err := l.attempt(ctx, st, deadline, st.Current.Names(), nil, true); err != nil || stop {
			return err
		}
		return l.drive(ctx, st, deadline)
	})
}

// Submit continues a loop waiting at needs_fix with the client's answer.
func (l *Loop) Submit(ctx context.Context, st *State, ans *Answer, provider string) error {
	if st.Status != apitypes.AutofixNeedsFix || st.Pending == nil {
		return fmt.Errorf("autofix %s is %s, not waiting for a fix", st.ID, st.Status)
	}
	return l.timed(ctx, st, func(ctx context.Context, deadline time.Time) error {
		st.Status = apitypes.AutofixRunning
		st.FixRequests++
		stop, err := l.applyAndRun(ctx, st, deadline, ans, provider, 0)
		if err != nil || stop {
			return err
		}
		return l.drive(ctx, st, deadline)
	})
}

// Expire ends a session nobody answered.
func (l *Loop) Expire(st *State) {
	st.Pending = nil
	l.stop(st, apitypes.AutofixExpired, apitypes.StopExpired, "the client did not answer in time")
}

// timed runs f with the loop's remaining time as deadline and adds the
// time f took to st.Used.
func (l *Loop) timed(ctx context.Context, st *State, f func(context.Context, time.Time) error) error {
	start := l.now()
	deadline := start.Add(st.Params.Timeout - st.Used)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := f(dctx, deadline)
	st.Used += l.now().Sub(start)
	if err != nil && !st.Done() {
		l.stop(st, apitypes.AutofixFailed, apitypes.StopError, err.Error())
	}
	l.progress(st)
	return err
}

// drive asks for fixes and runs them until the loop stops or waits for
// the client. The last attempt has failed when it is called.
func (l *Loop) drive(ctx context.Context, st *State, deadline time.Time) error {
	for {
		if st.FixRequests >= st.Params.MaxRetries {
			l.stop(st, apitypes.AutofixFailed, apitypes.StopMaxRetries,
				fmt.Sprintf("still failing after %d fixes (max_retries)", st.FixRequests))
			return nil
		}
		if !l.now().Before(deadline) {
			l.stopTimeout(st)
			return nil
		}
		req := l.fixRequest(st)
		if l.Provider == nil {
			st.Pending = req
			st.Status = apitypes.AutofixNeedsFix
			return nil
		}
		t0 := l.now()
		ans, err := l.Provider.Fix(ctx, req)
		providerMS := l.now().Sub(t0).Milliseconds()
		if errors.Is(err, ErrUseClient) {
			// The provider cannot answer for this client (sampling over a
			// protocol without server-initiated requests): the client
			// answers instead, through autofix_submit.
			st.Params.Provider = apitypes.ProviderClient
			st.Pending = req
			st.Status = apitypes.AutofixNeedsFix
			return nil
		}
		st.FixRequests++
		if err != nil {
			if ctx.Err() != nil || !l.now().Before(deadline) {
				l.stopTimeout(st)
				return nil
			}
			l.stop(st, apitypes.AutofixFailed, apitypes.StopProviderError, fmt.Sprintf("provider %s: %v", l.Provider.Name(), err))
			return nil
		}
		stop, err := l.applyAndRun(ctx, st, deadline, ans, l.Provider.Name(), providerMS)
		if err != nil || stop {
			return err
		}
	}
}

func (l *Loop) stopTimeout(st *State) {
	l.stop(st, apitypes.AutofixFailed, apitypes.StopTimeout,
		fmt.Sprintf("the loop's time (%s) ran out after %d attempts", st.Params.Timeout, len(st.Attempts)))
}

func (l *Loop) stop(st *State, status, reason, msg string) {
	st.Status, st.StopReason, st.Error = status, reason, msg
	st.Pending = nil
	if reason == apitypes.StopSuccess {
		st.Error = ""
	}
	l.emit(apitypes.AutofixEvent{Type: "result", AutofixID: st.ID, RunID: st.RunID, Result: st.Result()})
}

func (l *Loop) emit(ev apitypes.AutofixEvent) {
	if l.OnEvent != nil {
		l.OnEvent(ev)
	}
}

func (l *Loop) progress(st *State) {
	if l.OnProgress != nil {
		l.OnProgress(st)
	}
}

// fixRequest builds the request for the last (failed) attempt.
func (l *Loop) fixRequest(st *State) *FixRequest {
	last := st.Attempts[len(st.Attempts)-1]
	step, text := failure(st.Params.Success, st.Last)
	req := &FixRequest{
		Language: st.Params.Language, Entrypoint: st.Params.Entrypoint, Files: st.Current.Clone(),
		Attempt: last.Attempt, MaxAttempts: st.Params.MaxRetries + 1, Success: st.Params.Success,
		FailedStep: step, ExitCode: last.ExitCode, Termination: last.Termination, Error: text, Refused: st.Refused,
	}
	if st.Last != nil {
		req.BlockedSyscalls = st.Last.BlockedSyscalls
	}
	for _, a := range st.Attempts[:len(st.Attempts)-1] {
		s := fmt.Sprintf("attempt %d: %s", a.Attempt, describeTermination(a.ExitCode, a.Termination))
		if a.ErrorExcerpt != "" {
			s += ": " + a.ErrorExcerpt
		}
		if a.FixSummary != "" {
			s += "; then changed " + a.FixSummary
		}
		req.Earlier = append(req.Earlier, s)
	}
	return req
}

// applyAndRun applies an answer to the last failed attempt's files and
// runs the result. It reports whether the loop stopped.
func (l *Loop) applyAndRun(ctx context.Context, st *State, deadline time.Time, ans *Answer, provider string, providerMS int64) (bool, error) {
	n := len(st.Attempts) - 1
	a, rec := &st.Attempts[n], &st.Records[n]
	a.Provider, rec.Provider = provider, provider
	a.ProviderMS += providerMS
	if ans.Usage != nil {
		a.Tokens = addUsage(a.Tokens, ans.Usage)
		rec.Tokens = a.Tokens
	}
	next, err := l.applyAnswer(st, ans)
	if err != nil {
		var r *RefusedError
		if !errors.As(err, &r) {
			return false, err
		}
		st.Refused = r.Reason
		a.Refused = joinReason(a.Refused, r.Reason)
		rec.Refused = a.Refused
		a.FixSummary = "refused: " + r.Reason
		l.emit(apitypes.AutofixEvent{Type: "fix", AutofixID: st.ID, RunID: st.RunID, Attempt: ptr(*a)})
		l.progress(st)
		return false, nil
	}
	st.Refused = ""
	if next.Equal(st.Current) {
		a.FixSummary = "no change"
		l.stop(st, apitypes.AutofixFailed, apitypes.StopNoChange,
			fmt.Sprintf("provider %s answered with the code unchanged after attempt %d", provider, a.Attempt))
		return true, nil
	}
	changed := st.Current.Changed(next)
	var removed []string
	for _, c := range changed {
		if _, ok := next[c]; !ok {
			removed = append(removed, c)
		}
	}
	rec.Fix = UnifiedDiff(st.Current, next)
	a.FixSummary = Summary(st.Current, next)
	l.emit(apitypes.AutofixEvent{Type: "fix", AutofixID: st.ID, RunID: st.RunID, Attempt: ptr(*a)})
	install := slices.ContainsFunc(changed, IsDependencyFile)
	st.Current = next
	if !l.now().Before(deadline) {
		l.stopTimeout(st)
		return true, nil
	}
	return l.attempt(ctx, st, deadline, changed, removed, install)
}

func (l *Loop) applyAnswer(st *State, ans *Answer) (Files, error) {
	if ans.Files == nil {
		return Apply(st.Current, st.Params.Entrypoint, ans.Text)
	}
	next := st.Current.Clone()
	if len(ans.Files) == 0 {
		return nil, refusedf("the answer has no files")
	}
	for p, content := range ans.Files {
		rel, err := WorkspacePath(p)
		if err != nil {
			return nil, err
		}
		next[rel] = []byte(content)
	}
	return next, checkTree(next)
}

// attempt runs st.Current as the next attempt and records it. It reports
// whether the loop stopped.
func (l *Loop) attempt(ctx context.Context, st *State, deadline time.Time, changed, removed []string, install bool) (bool, error) {
	n := len(st.Attempts) + 1
	res, err := l.Runner.RunAttempt(ctx, AttemptRequest{
		Attempt: n, Files: st.Current, Entrypoint: st.Params.Entrypoint, Install: install,
		Changed: changed, Removed: removed, Test: st.Params.Success == apitypes.SuccessTests,
		TestCommand: st.Params.TestCommand, Deadline: deadline,
	})
	if err != nil {
		if ctx.Err() != nil && !l.now().Before(deadline) {
			l.stopTimeout(st)
			return true, nil
		}
		return true, fmt.Errorf("attempt %d: %w", n, err)
	}
	st.Last = res
	ok := Succeeded(st.Params.Success, res)
	step, text := failure(st.Params.Success, res)
	a := apitypes.AutofixAttempt{Attempt: n, ExitCode: res.ExitCode, Termination: res.Termination,
		Success: ok, DurationMS: res.DurationMS}
	rec := apitypes.FixedAttempt{Attempt: n, ExitCode: res.ExitCode, DurationMS: res.DurationMS, Termination: res.Termination.Cause}
	if !ok {
		a.ErrorExcerpt = step + ": " + excerpt(text)
		rec.Error = text
	}
	st.Attempts = append(st.Attempts, a)
	st.Records = append(st.Records, rec)
	l.emit(apitypes.AutofixEvent{Type: "attempt", AutofixID: st.ID, RunID: st.RunID, Attempt: ptr(a)})
	if ok {
		l.stop(st, apitypes.AutofixFixed, apitypes.StopSuccess, "")
		return true, nil
	}
	sig := signature(st.Current, step, res, text)
	if slices.Contains(st.Seen, sig) {
		l.stop(st, apitypes.AutofixFailed, apitypes.StopRepeatedError,
			fmt.Sprintf("attempt %d ran the same code as an earlier attempt and failed the same way", n))
		return true, nil
	}
	st.Seen = append(st.Seen, sig)
	l.progress(st)
	if !l.now().Before(deadline) {
		l.stopTimeout(st)
		return true, nil
	}
	return false, nil
}

// Succeeded applies a success rule to an attempt's result.
func Succeeded(rule string, res *apitypes.RunResult) bool {
	if res == nil || len(res.Steps) == 0 {
		return false
	}
	ran := false
	for _, st := range res.Steps {
		if !stepOK(st) {
			return false
		}
		switch st.Name {
		case StepRun:
			ran = true
			if rule == apitypes.SuccessExitZeroEmptyStderr && strings.TrimSpace(st.Stderr) != "" {
				return false
			}
		}
	}
	if !ran {
		return false
	}
	if rule == apitypes.SuccessTests {
		return slices.ContainsFunc(res.Steps, func(s apitypes.RunStep) bool { return s.Name == StepTest })
	}
	return true
}

func stepOK(st apitypes.RunStep) bool {
	return st.Termination.Cause == apitypes.CauseExited && st.ExitCode == 0
}

// failure names the step that failed the rule and the end of its output:
// stderr, and stdout when stderr says little (test runners report there).
func failure(rule string, res *apitypes.RunResult) (string, string) {
	if res == nil || len(res.Steps) == 0 {
		return "run", ""
	}
	for _, st := range res.Steps {
		if !stepOK(st) || (st.Name == StepRun && rule == apitypes.SuccessExitZeroEmptyStderr && strings.TrimSpace(st.Stderr) != "") {
			return st.Name, stepOutput(st)
		}
	}
	last := res.Steps[len(res.Steps)-1]
	return last.Name, stepOutput(last)
}

func stepOutput(st apitypes.RunStep) string {
	errText := strings.TrimSpace(st.Stderr)
	if len(errText) >= 200 || strings.TrimSpace(st.Stdout) == "" {
		return tail(st.Stderr, ErrorTailBytes)
	}
	return tail(strings.TrimRight(st.Stdout, "\n")+"\n"+st.Stderr, ErrorTailBytes)
}

// signature identifies a failure of some code: the files' digest, the
// failing step, how it ended and its error output.
func signature(files Files, step string, res *apitypes.RunResult, text string) string {
	h := sha256.New()
	for _, name := range files.Names() {
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(files[name]))
		h.Write(files[name])
	}
	fmt.Fprintf(h, "\x01%s\x00%d\x00%s\x00%s", step, res.ExitCode, res.Termination.Cause, text)
	return hex.EncodeToString(h.Sum(nil))
}

func addUsage(a, b *apitypes.TokenUsage) *apitypes.TokenUsage {
	out := &apitypes.TokenUsage{}
	if a != nil {
		*out = *a
	}
	out.InputTokens += b.InputTokens
	out.OutputTokens += b.OutputTokens
	return out
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func ptr[T any](v T) *T { return &v }
