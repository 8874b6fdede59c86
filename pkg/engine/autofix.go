package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The autofix loop over the run pipeline: one CodeRun (kind "autofix") and
// one sandbox per loop, an Attempt per run. The loop's state lives in
// SQLite (autofix_sessions) from start to end, so autofix_status can read
// any loop and a client-provider session waiting for autofix_submit
// survives a daemon restart.

// AutofixRequest is the input of autofix.
type AutofixRequest = apitypes.AutofixRequest

// AutofixSubmitRequest is the input of autofix_submit.
type AutofixSubmitRequest = apitypes.AutofixSubmitRequest

// AutofixResult is the answer of autofix, autofix_submit and autofix_status.
type AutofixResult = apitypes.AutofixResult

// AutofixOptions are what a front end adds to a call.
type AutofixOptions struct {
	// Sampling is the calling MCP client's model, when the client declared
	// the sampling capability; provider "sampling" without it falls back to
	// "client".
	Sampling autofix.Provider
	// OnEvent, if set, sees every attempt, fix and the result as they
	// happen (progress notifications, the NDJSON stream).
	OnEvent func(apitypes.AutofixEvent)
	// OnOutput, if set, receives the steps' output as it arrives.
	OnOutput sandbox.OutputFunc
	// MaxOutputBytes caps each stream in the results (0: the default).
	MaxOutputBytes int64
}

// autofixState is the engine's autofix bookkeeping (Engine embeds it).
type autofixState struct {
	afOnce      sync.Once
	afInterrupt sync.Once
	afMetrics   *autofixMetrics
	afMu        sync.Mutex
	afLocks     map[string]*sync.Mutex
}

// autofixMetrics are the loop's Prometheus instruments.
type autofixMetrics struct {
	runs      *prometheus.CounterVec
	attempts  prometheus.Histogram
	timeToFix prometheus.Histogram
}

func (e *Engine) autofixInit() *autofixMetrics {
	e.afOnce.Do(func() {
		m := &autofixMetrics{
			runs: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "sandboxd", Name: "autofix_runs_total",
				Help: "Finished autofix loops by outcome (fixed, or the stop reason: max_retries, timeout, no_change, repeated_error, provider_error, expired, error).",
			}, []string{"outcome"}),
			attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
				Namespace: "sandboxd", Name: "autofix_attempts_per_success",
				Help: "Attempts (runs, the original included) of the autofix loops that succeeded.", Buckets: prometheus.LinearBuckets(1, 1, 21),
			}),
			timeToFix: prometheus.NewHistogram(prometheus.HistogramOpts{
				Namespace: "sandboxd", Name: "autofix_time_to_fix_seconds",
				Help: "Time the successful autofix loops took, fix requests included.", Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
			}),
		}
		e.metrics.registry.MustRegister(m.runs, m.attempts, m.timeToFix)
		e.afMetrics = m
		e.afLocks = map[string]*sync.Mutex{}
	})
	return e.afMetrics
}

// autofixReady prepares the autofix bookkeeping before the first call of
// this engine: metrics, and the loops an earlier daemon left running.
func (e *Engine) autofixReady() {
	e.autofixInit()
	e.afInterrupt.Do(e.interruptAutofixSessions)
}

// interruptAutofixSessions ends the loops an earlier daemon was running
// when it stopped (no loop of this process runs yet): their record is
// finished and their sandbox removed. Loops waiting for the client's fix
// are not running and stay.
func (e *Engine) interruptAutofixSessions() {
	ctx := context.Background()
	rows, err := e.store.AutofixSessionsByStatus(ctx, apitypes.AutofixRunning)
	if err != nil {
		e.log.Warn("autofix: list interrupted loops", "err", err)
		return
	}
	for _, row := range rows {
		sess, _, err := e.loadAutofix(ctx, row.ID)
		if err != nil {
			continue
		}
		h, _, err := e.catalog.Handler("language", sess.State.Params.Language)
		if err != nil {
			continue
		}
		sess.State.Status, sess.State.StopReason = apitypes.AutofixFailed, apitypes.StopError
		sess.State.Error = "the daemon stopped while the loop was running"
		run, _, err := e.resumeAutofixRunNoSandbox(sess, h)
		if err != nil {
			e.log.Warn("autofix: interrupted loop", "autofix", row.ID, "err", err)
			continue
		}
		e.finishAutofix(ctx, sess, run)
	}
}

// autofixLock serialises the calls on one loop (a submit racing another).
func (e *Engine) autofixLock(id string) func() {
	e.autofixInit()
	e.afMu.Lock()
	l, ok := e.afLocks[id]
	if !ok {
		l = &sync.Mutex{}
		e.afLocks[id] = l
	}
	e.afMu.Unlock()
	l.Lock()
	return l.Unlock
}

// autofixSession is what autofix_sessions.state holds: the loop's state
// and what the engine needs to resume its run record and sandbox.
type autofixSession struct {
	State     *autofix.State `json:"state"`
	Meta      runs.Metadata  `json:"meta"`
	StartedAt time.Time      `json:"started_at"`
	SandboxID string         `json:"sandbox_id"`
	Network   string         `json:"network"`
	Args      []string       `json:"args,omitempty"`
	Stdin     string         `json:"stdin,omitempty"`
	ExpiresAt time.Time      `json:"expires_at,omitempty"`
}

var autofixIDRE = regexp.MustCompile(`^af-[0-9a-f]{16}$`)

func newAutofixID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "af-" + hex.EncodeToString(b[:])
}

// autofixProvider resolves a provider name (empty: the configured
// default) to a provider; nil is the client provider. The name returned is
// the provider that will actually answer.
func (e *Engine) autofixProvider(name string, opts *AutofixOptions) (autofix.Provider, string, error) {
	ac := e.cfg.Autofix
	if name == "" {
		name = ac.Provider
	}
	switch name {
	case apitypes.ProviderClient:
		return nil, name, nil
	case apitypes.ProviderSampling:
		if opts.Sampling == nil {
			return nil, apitypes.ProviderClient, nil
		}
		return opts.Sampling, name, nil
	case apitypes.ProviderAnthropic:
		p := &autofix.AnthropicProvider{Model: ac.Model, BaseURL: ac.BaseURL, MaxTokens: int64(ac.MaxTokens),
			KeyEnv: ac.APIKeyEnv, KeyFile: ac.APIKeyFile}
		if err := p.Configured(); err != nil {
			return nil, "", errdefs.Invalidf("provider: anthropic is not configured on this server: %v", err)
		}
		return p, name, nil
	case apitypes.ProviderCommand:
		if len(ac.Command) == 0 {
			return nil, "", errdefs.Invalidf("provider: command is not configured on this server (autofix.command is empty)")
		}
		return &autofix.CommandProvider{Argv: ac.Command, Timeout: ac.CommandTimeout.D()}, name, nil
	case apitypes.ProviderAgent:
		if e.net == nil || e.netCfg.Credentials[AgentCredential].BaseURL == nil {
			return nil, "", errdefs.Invalidf("provider: agent needs network.credentials.%s configured on this server (and the network subsystem up)", AgentCredential)
		}
		return &agentFixProvider{e: e}, name, nil
	}
	return nil, "", errdefs.Invalidf("provider: unknown provider %q (one of client, sampling, anthropic, command, agent)", name)
}

// Autofix runs a program and, while it fails, asks the provider for fixes
// and runs them, in one sandbox kept for the loop. With the client
// provider it returns at the first failure with status needs_fix and a
// prompt; autofix_submit continues.
func (e *Engine) Autofix(ctx context.Context, req AutofixRequest, opts AutofixOptions) (*AutofixResult, error) {
	e.autofixReady()
	e.expireAutofixSessions(ctx)
	ac := e.cfg.Autofix
	h, files, main, err := e.program(req.Language, req.Code, req.Files, req.Entrypoint, req.Args, req.Stdin)
	if err != nil {
		return nil, err
	}
	p := autofix.Params{Language: h.Name, Entrypoint: main, MaxRetries: ac.MaxRetries, Timeout: ac.Timeout.D(),
		Success: req.Success, TestCommand: req.TestCommand}
	if p.Success == "" {
		p.Success = ac.Success
	}
	if err := p.Validate(req.MaxRetries, ac.MaxRetriesCap); err != nil {
		return nil, errdefs.Invalidf("%v", err)
	}
	if req.TimeoutSeconds != nil {
		if p.Timeout, err = duration("timeout_seconds", *req.TimeoutSeconds, ac.MaxTimeout.D()); err != nil {
			return nil, err
		}
	}
	if strings.ContainsRune(req.TestCommand, 0) || len(req.TestCommand) > 4096 {
		return nil, errdefs.Invalidf("test_command: must be at most 4096 bytes without NUL")
	}
	if p.Success == apitypes.SuccessTests && p.TestCommand == "" {
		if _, ok := h.Tasks["test"]; !ok {
			return nil, errdefs.Invalidf("success: %s has no test task; give test_command", h.Name)
		}
	}
	provider, pname, err := e.autofixProvider(req.Provider, &opts)
	if err != nil {
		return nil, err
	}
	p.Provider = pname
	network, err := e.networkMode("network", req.Network)
	if err != nil {
		return nil, err
	}

	id := newAutofixID()
	create := CreateSandboxRequest{Language: h.Name, Network: network, Labels: map[string]string{"sandboxd.autofix": id}}
	agentFix, _ := provider.(*agentFixProvider)
	if agentFix != nil {
		// The agent's image (it has the CLI and the usual runtimes), the
		// credential, and no destination but the proxy unless asked.
		create.Image, create.Credentials = AgentImage, []string{AgentCredential}
		if create.Network == NetworkNone {
			create.Network = NetworkAllowlist
		}
	}
	sb, err := e.CreateSandbox(ctx, create)
	if err != nil {
		return nil, err
	}
	if agentFix != nil {
		agentFix.sandboxID = sb.ID
	}
	run, err := e.StartRun(ctx, RunSpec{Handler: h, Kind: "autofix", SandboxID: sb.ID, Entrypoint: main,
		Args: req.Args, Deadline: time.Now().Add(p.Timeout)})
	if err != nil {
		e.terminateAutofixSandbox(ctx, sb.ID, id)
		return nil, err
	}
	run.Meta.Ephemeral = true // the loop's own sandbox, removed when the loop ends
	sess := &autofixSession{State: autofix.NewState(id, run.Record.ID, p, files), StartedAt: time.Now(),
		SandboxID: sb.ID, Network: network, Args: req.Args, Stdin: req.Stdin}
	return e.driveAutofix(ctx, sess, run, h, provider, &opts, func(l *autofix.Loop) error {
		return l.Start(ctx, sess.State)
	})
}

// AutofixSubmit continues a client-provider loop waiting at needs_fix with
// the client's fix: whole files, the entrypoint's code, or an answer in
// the providers' format (a diff or fenced blocks).
func (e *Engine) AutofixSubmit(ctx context.Context, req AutofixSubmitRequest, opts AutofixOptions) (*AutofixResult, error) {
	e.autofixReady()
	e.expireAutofixSessions(ctx)
	if !autofixIDRE.MatchString(req.AutofixID) {
		return nil, errdefs.Invalidf("autofix_id: malformed %q", req.AutofixID)
	}
	given := 0
	for _, set := range []bool{req.Code != "", len(req.Files) > 0, req.Answer != ""} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, errdefs.Invalidf("code: give exactly one of code, files or answer")
	}
	total := len(req.Code) + len(req.Answer)
	for _, c := range req.Files {
		total += len(c)
	}
	if len(req.Files) > MaxRunFiles || total > MaxRunFilesBytes {
		return nil, errdefs.LimitExceededf("files: at most %d files and %d bytes", MaxRunFiles, MaxRunFilesBytes)
	}
	unlock := e.autofixLock(req.AutofixID)
	defer unlock()
	sess, _, err := e.loadAutofix(ctx, req.AutofixID)
	if err != nil {
		return nil, err
	}
	st := sess.State
	if st.Status != apitypes.AutofixNeedsFix {
		return nil, errdefs.Conflictf("autofix_id: autofix %s is %s, not waiting for a fix", st.ID, st.Status)
	}
	ans := &autofix.Answer{Text: req.Answer}
	switch {
	case req.Code != "":
		ans.Files = map[string]string{st.Params.Entrypoint: req.Code}
	case len(req.Files) > 0:
		ans.Files = req.Files
	}
	h, _, err := e.catalog.Handler("language", st.Params.Language)
	if err != nil {
		return nil, err
	}
	run, fresh, err := e.resumeAutofixRun(ctx, sess, h)
	if err != nil {
		return nil, err
	}
	return e.driveAutofix(ctx, sess, run, h, nil, &opts, func(l *autofix.Loop) error {
		l.Runner.(*autofixRunner).fresh = fresh
		return l.Submit(ctx, st, ans, apitypes.ProviderClient)
	})
}

// AutofixStatus reports a loop: running, waiting for a fix, or finished.
func (e *Engine) AutofixStatus(ctx context.Context, id string) (*AutofixResult, error) {
	e.autofixReady()
	e.expireAutofixSessions(ctx)
	if !autofixIDRE.MatchString(id) {
		return nil, errdefs.Invalidf("autofix_id: malformed %q", id)
	}
	sess, _, err := e.loadAutofix(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.autofixResult(sess), nil
}

func (e *Engine) autofixResult(sess *autofixSession) *AutofixResult {
	r := sess.State.Result()
	if !sess.ExpiresAt.IsZero() && r.Status == apitypes.AutofixNeedsFix {
		t := sess.ExpiresAt.UTC()
		r.ExpiresAt = &t
	}
	if r.SandboxID == "" {
		r.SandboxID = sess.SandboxID
	}
	return r
}

// driveAutofix runs the loop (start or submit) and then either finishes
// the loop — record, sandbox, metrics — or parks it at needs_fix.
func (e *Engine) driveAutofix(ctx context.Context, sess *autofixSession, run *CodeRun, h *lang.Handler,
	provider autofix.Provider, opts *AutofixOptions, step func(*autofix.Loop) error) (*AutofixResult, error) {
	st := sess.State
	runner := &autofixRunner{e: e, run: run, h: h, sess: sess, opts: opts}
	loop := &autofix.Loop{Runner: runner, Provider: provider,
		OnEvent: func(ev apitypes.AutofixEvent) {
			e.sandboxes.PublishAutofix(sess.SandboxID, ev)
			if opts.OnEvent != nil {
				opts.OnEvent(ev)
			}
		},
		OnProgress: func(st *autofix.State) {
			if err := run.Record.WriteJSON(runs.FixedAttemptsJSON, st.Records); err != nil {
				e.log.Warn("autofix: write fixed attempts", "autofix", st.ID, "err", err)
			}
			if err := e.saveAutofix(context.WithoutCancel(ctx), sess, run); err != nil {
				e.log.Warn("autofix: save session", "autofix", st.ID, "err", err)
			}
		},
	}
	loopErr := step(loop)
	wctx := context.WithoutCancel(ctx)
	if st.Status == apitypes.AutofixNeedsFix {
		sess.ExpiresAt = time.Now().Add(e.cfg.Autofix.SessionTTL.D())
		sess.Meta = run.Meta
		if err := run.Record.Close(); err != nil {
			e.log.Warn("autofix: close run logs", "run", run.Record.ID, "err", err)
		}
		if err := e.saveAutofix(wctx, sess, run); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "save autofix session")
		}
		return e.autofixResult(sess), nil
	}
	e.finishAutofix(wctx, sess, run)
	if loopErr != nil && len(st.Attempts) == 0 {
		return nil, loopErr
	}
	return e.autofixResult(sess), nil
}

// finishAutofix writes the record's metadata (success is the loop's),
// removes the loop's sandbox, stores the final state and counts the loop.
func (e *Engine) finishAutofix(ctx context.Context, sess *autofixSession, run *CodeRun) {
	st := sess.State
	if err := run.Record.WriteJSON(runs.FixedAttemptsJSON, st.Records); err != nil {
		e.log.Warn("autofix: write fixed attempts", "autofix", st.ID, "err", err)
	}
	var res *RunResult
	var runErr error
	if st.Last != nil {
		c := *st.Last
		c.Success = st.Status == apitypes.AutofixFixed
		res = &c
	} else {
		runErr = errors.New(st.Error)
	}
	run.Meta.Attempts = len(st.Attempts)
	if st.Error != "" && st.Status != apitypes.AutofixFixed {
		run.Meta.Error = st.StopReason + ": " + st.Error
	}
	if err := run.Finish(ctx, res, runErr); err != nil {
		e.log.Error("autofix: write run record", "run", run.Record.ID, "err", err)
	}
	e.terminateAutofixSandbox(ctx, sess.SandboxID, st.ID)
	sess.ExpiresAt = time.Time{}
	if err := e.saveAutofix(ctx, sess, run); err != nil {
		e.log.Error("autofix: save session", "autofix", st.ID, "err", err)
	}
	m := e.autofixInit()
	outcome := st.StopReason
	if st.Status == apitypes.AutofixFixed {
		outcome = "fixed"
		m.attempts.Observe(float64(len(st.Attempts)))
		m.timeToFix.Observe(st.Used.Seconds())
	}
	m.runs.WithLabelValues(outcome).Inc()
	e.log.Info("autofix finished", "autofix", st.ID, "run", run.Record.ID, "status", st.Status,
		"reason", st.StopReason, "attempts", len(st.Attempts), "provider", st.Params.Provider)
}

func (e *Engine) terminateAutofixSandbox(ctx context.Context, sandboxID, id string) {
	if sandboxID == "" {
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := e.TerminateSandbox(tctx, sandboxID); err != nil && errdefs.CodeOf(err) != errdefs.NotFound && errdefs.CodeOf(err) != errdefs.Conflict {
		e.log.Error("autofix: terminate sandbox", "sandbox", sandboxID, "autofix", id, "err", err)
	}
}

func (e *Engine) saveAutofix(ctx context.Context, sess *autofixSession, run *CodeRun) error {
	if run != nil {
		sess.Meta = run.Meta
	}
	raw, err := json.Marshal(sess)
	if err != nil {
		return err
	}
	now := time.Now()
	return e.store.PutAutofixSession(ctx, &store.AutofixSession{
		ID: sess.State.ID, RunID: sess.State.RunID, SandboxID: sess.SandboxID, Status: sess.State.Status,
		CreatedAt: sess.StartedAt, UpdatedAt: now, ExpiresAt: sess.ExpiresAt, State: raw,
	})
}

func (e *Engine) loadAutofix(ctx context.Context, id string) (*autofixSession, *store.AutofixSession, error) {
	row, err := e.store.GetAutofixSession(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !e.sandboxes.Visible(ctx, row.SandboxID)) {
		return nil, nil, errdefs.NotFoundf("autofix %s not found", id)
	}
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "read autofix %s", id)
	}
	var sess autofixSession
	if err := json.Unmarshal(row.State, &sess); err != nil || sess.State == nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, fmt.Errorf("unreadable state: %v", err), "autofix %s", id)
	}
	return &sess, row, nil
}

// resumeAutofixRun reopens a parked loop's run record and finds its
// sandbox. A sandbox that did not survive the wait (idle timeout, daemon
// host reboot) is replaced by a new one: fresh says so, and the next
// attempt installs the dependencies again.
func (e *Engine) resumeAutofixRun(ctx context.Context, sess *autofixSession, h *lang.Handler) (*CodeRun, bool, error) {
	rs, err := e.runStore()
	if err != nil {
		return nil, false, err
	}
	rec, err := rs.Reopen(sess.State.RunID, sess.StartedAt)
	if err != nil {
		return nil, false, errdefs.Wrap(errdefs.Internal, err, "reopen run record")
	}
	run := &CodeRun{e: e, h: h, Record: rec, Meta: sess.Meta}
	fresh := false
	sb, err := e.sandboxes.Get(ctx, sess.SandboxID)
	if err != nil || !(sb.State == sandbox.StateReady || sb.State == sandbox.StateRunning) {
		if sb, err = e.CreateSandbox(ctx, CreateSandboxRequest{Language: h.Name, Network: sess.Network,
			Labels: map[string]string{"sandboxd.autofix": sess.State.ID}}); err != nil {
			_ = rec.Close()
			return nil, false, err
		}
		sess.SandboxID, fresh = sb.ID, true
		run.Meta.SandboxID, run.Meta.ImageDigest = sb.ID, sb.ImageDigest
	}
	run.Sandbox = sb
	return run, fresh, nil
}

// expireAutofixSessions ends the needs_fix sessions nobody answered in
// time: their record is finished and their sandbox removed.
func (e *Engine) expireAutofixSessions(ctx context.Context) {
	// Finished loops' rows go with the run records' age limit.
	if age := e.cfg.Runs.MaxAge.D(); age > 0 {
		if _, err := e.store.DeleteAutofixSessions(ctx, time.Now().Add(-age)); err != nil {
			e.log.Warn("autofix: session retention", "err", err)
		}
	}
	rows, err := e.store.ExpiredAutofixSessions(ctx, apitypes.AutofixNeedsFix, time.Now())
	if err != nil {
		e.log.Warn("autofix: list expired sessions", "err", err)
		return
	}
	for _, row := range rows {
		func() {
			unlock := e.autofixLock(row.ID)
			defer unlock()
			sess, _, err := e.loadAutofix(ctx, row.ID)
			if err != nil || sess.State.Status != apitypes.AutofixNeedsFix {
				return
			}
			h, _, err := e.catalog.Handler("language", sess.State.Params.Language)
			if err != nil {
				return
			}
			(&autofix.Loop{}).Expire(sess.State)
			run, _, err := e.resumeAutofixRunNoSandbox(sess, h)
			if err != nil {
				e.log.Warn("autofix: expire", "autofix", row.ID, "err", err)
				return
			}
			e.finishAutofix(context.WithoutCancel(ctx), sess, run)
		}()
	}
}

// resumeAutofixRunNoSandbox reopens the record of a loop that is ending
// without another attempt.
func (e *Engine) resumeAutofixRunNoSandbox(sess *autofixSession, h *lang.Handler) (*CodeRun, bool, error) {
	rs, err := e.runStore()
	if err != nil {
		return nil, false, err
	}
	rec, err := rs.Reopen(sess.State.RunID, sess.StartedAt)
	if err != nil {
		return nil, false, err
	}
	return &CodeRun{e: e, h: h, Record: rec, Meta: sess.Meta}, false, nil
}

// autofixRunner is the loop's Runner: one pipeline attempt in the loop's
// sandbox, then the test step under the tests rule.
type autofixRunner struct {
	e     *Engine
	run   *CodeRun
	h     *lang.Handler
	sess  *autofixSession
	opts  *AutofixOptions
	fresh bool // a new sandbox: install and write everything
}

func (r *autofixRunner) RunAttempt(ctx context.Context, req autofix.AttemptRequest) (*apitypes.RunResult, error) {
	for _, name := range req.Removed {
		if err := r.e.sandboxes.DeleteFile(ctx, r.run.Sandbox.ID, lang.Workspace+"/"+name, false); err != nil && errdefs.CodeOf(err) != errdefs.NotFound {
			return nil, fmt.Errorf("remove %s: %w", name, err)
		}
	}
	r.run.deadline = req.Deadline
	var stdin []byte
	if r.sess.Stdin != "" {
		stdin = []byte(r.sess.Stdin)
	}
	a := Attempt{Number: req.Attempt, Files: req.Files, Main: req.Entrypoint, Args: r.sess.Args, Stdin: stdin,
		Install: req.Install || r.fresh, MaxOutputBytes: r.opts.MaxOutputBytes, OnOutput: r.opts.OnOutput}
	r.fresh = false
	start := time.Now()
	res, err := r.run.Run(ctx, a)
	if err != nil {
		return nil, err
	}
	defer func() { res.DurationMS = time.Since(start).Milliseconds() }()
	if req.Test && res.Success {
		argv := []string{"/bin/sh", "-c", req.TestCommand}
		if req.TestCommand == "" {
			vars := lang.Vars{Path: ".", File: ".", Out: buildRoot + "/" + r.run.Record.ID, Files: r.h.Sources(req.Files.Names())}
			argv = lang.Expand(r.h.Tasks["test"], vars)
		}
		st, err := r.run.step(ctx, &a, res, autofix.StepTest, argv, nil, nil)
		if err != nil {
			return nil, err
		}
		res.Success = stepOK(st)
	}
	return res, nil
}

// maxExportFile caps a file's content in an exported correction.
const maxExportFile = 1 << 20

// ExportCorrections writes the corrections of every autofix run record,
// newest run first: for each fix (or refused answer), the code it was
// given, the error, the fix as a diff and what came of it — a data set of
// corrections (sandboxctl runs export --format jsonl).
func (e *Engine) ExportCorrections(ctx context.Context, emit func(apitypes.CorrectionRecord) error) error {
	rs, err := e.runStore()
	if err != nil {
		return err
	}
	list, err := rs.List(ctx, store.RunFilter{Kind: "autofix"})
	if err != nil {
		return err
	}
	for _, m := range list {
		if err := ctx.Err(); err != nil {
			return err
		}
		run, err := rs.Get(ctx, m.RunID, 1)
		if err != nil {
			continue // pruned meanwhile
		}
		for i, fa := range run.Attempts {
			if fa.Fix == "" && fa.Refused == "" {
				continue
			}
			outcome := "refused"
			if fa.Fix != "" {
				outcome = "failed_again"
				if i+1 < len(run.Attempts) && run.Attempts[i+1].Error == "" && run.Metadata.Success && i+2 == len(run.Attempts) {
					outcome = "fixed"
				}
			}
			code, err := readSnapshot(filepath.Join(run.Dir, runs.SnapshotDir, fmt.Sprintf("attempt_%d", fa.Attempt)))
			if err != nil {
				continue
			}
			if err := emit(apitypes.CorrectionRecord{RunID: m.RunID, Attempt: fa.Attempt, Language: m.Language, Code: code,
				Error: fa.Error, Fix: fa.Fix, Outcome: outcome, Provider: fa.Provider}); err != nil {
				return err
			}
		}
	}
	return nil
}

// readSnapshot reads an attempt's code snapshot: path relative to the
// snapshot → content (files over maxExportFile are left out).
func readSnapshot(dir string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil || fi.Size() > maxExportFile {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	return out, err
}
