// Package fixloop is the autofix service: autofix, autofix_submit,
// autofix_status and the export of corrections. It drives pkg/autofix's loop
// over the run pipeline (pkg/services/pipeline): one CodeRun (kind
// "autofix") and one sandbox per loop, an Attempt per run. It needs of the
// engine only what its Lifecycle, Sandboxes, Store and Agents interfaces
// name, so it never imports pkg/engine.
package fixloop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/agents"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// The loop's state lives in
// SQLite (autofix_sessions) from start to end, so autofix_status can read
// any loop and a client-provider session waiting for autofix_submit
// survives a daemon restart.

// AutofixRequest is the input of autofix.
type AutofixRequest = apitypes.AutofixRequest

// AutofixSubmitRequest is the input of autofix_submit.
type AutofixSubmitRequest = apitypes.AutofixSubmitRequest

// AutofixResult is the answer of autofix, autofix_submit and autofix_status.
type AutofixResult = apitypes.AutofixResult

// CallOptions are what a front end adds to a call.
type CallOptions struct {
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

// Sandboxes is what the loops need of the sandbox manager.
type Sandboxes interface {
	Get(ctx context.Context, id string) (*sandbox.Info, error)
	DeleteFile(ctx context.Context, id, path string, recursive bool) error
	// PublishAutofix sends a loop's event to the sandbox's watchers.
	PublishAutofix(sandboxID string, ev apitypes.AutofixEvent)
	// Visible says whether the caller's tenant may see sandbox id (a
	// loop is its sandbox's: another tenant's is not found).
	Visible(ctx context.Context, id string) bool
}

// Lifecycle is what the loops need of the engine: a loop's sandbox is an
// ordinary one, created and terminated with the engine's validation, and a
// request's network mode is resolved as for any sandbox.
type Lifecycle interface {
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error)
	NetworkMode(field, mode string) (string, error)
}

// Store keeps the loops' state (the autofix_sessions table).
type Store interface {
	PutAutofixSession(ctx context.Context, s *store.AutofixSession) error
	GetAutofixSession(ctx context.Context, id string) (*store.AutofixSession, error)
	AutofixSessionsByStatus(ctx context.Context, status string) ([]*store.AutofixSession, error)
	ExpiredAutofixSessions(ctx context.Context, status string, now time.Time) ([]*store.AutofixSession, error)
	DeleteAutofixSessions(ctx context.Context, before time.Time) (int64, error)
}

// Agents is the agent service as the provider "agent" uses it.
type Agents interface {
	// Ready reports whether agent sessions can run (the credential is
	// configured and the network is up).
	Ready() bool
	Run(ctx context.Context, req apitypes.AgentRunRequest, progress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error)
}

// Pipeline is the run pipeline as the loops use it: one run record and
// sandbox per loop, an attempt per run.
type Pipeline interface {
	Program(language, code string, files map[string]string, entrypoint string, args []string, stdin string) (*lang.Handler, map[string][]byte, string, error)
	StartRun(ctx context.Context, spec pipeline.RunSpec) (*pipeline.CodeRun, error)
	Resume(rec *runs.Record, h *lang.Handler, meta runs.Metadata, sb *sandbox.Info) *pipeline.CodeRun
	Records() (*runs.Store, error)
}

// Options are what New needs.
type Options struct {
	Pipeline  Pipeline
	Sandboxes Sandboxes
	Lifecycle Lifecycle
	Store     Store
	Agents    Agents
	Catalog   *lang.Catalog
	// Config is the daemon's autofix section, shared (not copied).
	Config *config.Autofix
	// RecordsMaxAge is the run records' age limit (runs.max_age): finished
	// loops' rows go with it.
	RecordsMaxAge time.Duration
	// Registerer takes the loops' Prometheus instruments.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Service runs autofix loops.
type Service struct {
	o           Options
	log         *slog.Logger
	afOnce      sync.Once
	afInterrupt sync.Once
	afMetrics   *autofixMetrics
	afMu        sync.Mutex
	afLocks     map[string]*sync.Mutex
}

// New returns the service; its first call ends the loops an earlier daemon
// left running.
func New(o Options) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Service{o: o, log: o.Log}
}

// autofixMetrics are the loop's Prometheus instruments.
type autofixMetrics struct {
	runs      *prometheus.CounterVec
	attempts  prometheus.Histogram
	timeToFix prometheus.Histogram
}

func (s *Service) autofixInit() *autofixMetrics {
	s.afOnce.Do(func() {
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
		s.o.Registerer.MustRegister(m.runs, m.attempts, m.timeToFix)
		s.afMetrics = m
		s.afLocks = map[string]*sync.Mutex{}
	})
	return s.afMetrics
}

// autofixReady prepares the autofix bookkeeping before the first call of
// this engine: metrics, and the loops an earlier daemon left running.
func (s *Service) autofixReady() {
	s.autofixInit()
	s.afInterrupt.Do(s.interruptAutofixSessions)
}

// interruptAutofixSessions ends the loops an earlier daemon was running
// when it stopped (no loop of this process runs yet): their record is
// finished and their sandbox removed. Loops waiting for the client's fix
// are not running and stay.
func (s *Service) interruptAutofixSessions() {
	ctx := context.Background()
	rows, err := s.o.Store.AutofixSessionsByStatus(ctx, apitypes.AutofixRunning)
	if err != nil {
		s.log.Warn("autofix: list interrupted loops", "err", err)
		return
	}
	for _, row := range rows {
		sess, _, err := s.loadAutofix(ctx, row.ID)
		if err != nil {
			continue
		}
		h, _, err := s.o.Catalog.Handler("language", sess.State.Params.Language)
		if err != nil {
			continue
		}
		sess.State.Status, sess.State.StopReason = apitypes.AutofixFailed, apitypes.StopError
		sess.State.Error = "the daemon stopped while the loop was running"
		run, _, err := s.resumeAutofixRunNoSandbox(sess, h)
		if err != nil {
			s.log.Warn("autofix: interrupted loop", "autofix", row.ID, "err", err)
			continue
		}
		s.finishAutofix(ctx, sess, run)
	}
}

// autofixLock serialises the calls on one loop (a submit racing another).
func (s *Service) autofixLock(id string) func() {
	s.autofixInit()
	s.afMu.Lock()
	l, ok := s.afLocks[id]
	if !ok {
		l = &sync.Mutex{}
		s.afLocks[id] = l
	}
	s.afMu.Unlock()
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
func (s *Service) autofixProvider(name string, opts *CallOptions) (autofix.Provider, string, error) {
	ac := s.o.Config
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
		if s.o.Agents == nil || !s.o.Agents.Ready() {
			return nil, "", errdefs.Invalidf("provider: agent needs network.credentials.%s configured on this server (and the network subsystem up)", agents.AgentCredential)
		}
		return &agentFixProvider{agents: s.o.Agents}, name, nil
	}
	return nil, "", errdefs.Invalidf("provider: unknown provider %q (one of client, sampling, anthropic, command, agent)", name)
}

// Autofix runs a program and, while it fails, asks the provider for fixes
// and runs them, in one sandbox kept for the loop. With the client
// provider it returns at the first failure with status needs_fix and a
// prompt; autofix_submit continues.
func (s *Service) Autofix(ctx context.Context, req AutofixRequest, opts CallOptions) (*AutofixResult, error) {
	s.autofixReady()
	s.expireAutofixSessions(ctx)
	ac := s.o.Config
	h, files, main, err := s.o.Pipeline.Program(req.Language, req.Code, req.Files, req.Entrypoint, req.Args, req.Stdin)
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
		if p.Timeout, err = apitypes.Seconds("timeout_seconds", *req.TimeoutSeconds, ac.MaxTimeout.D()); err != nil {
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
	provider, pname, err := s.autofixProvider(req.Provider, &opts)
	if err != nil {
		return nil, err
	}
	p.Provider = pname
	network, err := s.o.Lifecycle.NetworkMode("network", req.Network)
	if err != nil {
		return nil, err
	}

	id := newAutofixID()
	create := apitypes.CreateSandboxRequest{Language: h.Name, Network: network, Labels: map[string]string{"sandboxd.autofix": id}}
	agentFix, _ := provider.(*agentFixProvider)
	if agentFix != nil {
		// The agent's image (it has the CLI and the usual runtimes), the
		// credential, and no destination but the proxy unless asked.
		create.Image, create.Credentials = agents.AgentImage, []string{agents.AgentCredential}
		if create.Network == "none" {
			create.Network = "allowlist"
		}
	}
	sb, err := s.o.Lifecycle.CreateSandbox(ctx, create)
	if err != nil {
		return nil, err
	}
	if agentFix != nil {
		agentFix.sandboxID = sb.ID
	}
	run, err := s.o.Pipeline.StartRun(ctx, pipeline.RunSpec{Handler: h, Kind: "autofix", SandboxID: sb.ID, Entrypoint: main,
		Args: req.Args, Deadline: time.Now().Add(p.Timeout)})
	if err != nil {
		s.terminateAutofixSandbox(ctx, sb.ID, id)
		return nil, err
	}
	run.Meta.Ephemeral = true // the loop's own sandbox, removed when the loop ends
	sess := &autofixSession{State: autofix.NewState(id, run.Record.ID, p, files), StartedAt: time.Now(),
		SandboxID: sb.ID, Network: network, Args: req.Args, Stdin: req.Stdin}
	return s.driveAutofix(ctx, sess, run, h, provider, &opts, func(l *autofix.Loop) error {
		return l.Start(ctx, sess.State)
	})
}

// AutofixSubmit continues a client-provider loop waiting at needs_fix with
// the client's fix: whole files, the entrypoint's code, or an answer in
// the providers' format (a diff or fenced blocks).
func (s *Service) AutofixSubmit(ctx context.Context, req AutofixSubmitRequest, opts CallOptions) (*AutofixResult, error) {
	s.autofixReady()
	s.expireAutofixSessions(ctx)
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
	if len(req.Files) > pipeline.MaxRunFiles || total > pipeline.MaxRunFilesBytes {
		return nil, errdefs.LimitExceededf("files: at most %d files and %d bytes", pipeline.MaxRunFiles, pipeline.MaxRunFilesBytes)
	}
	unlock := s.autofixLock(req.AutofixID)
	defer unlock()
	sess, _, err := s.loadAutofix(ctx, req.AutofixID)
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
	h, _, err := s.o.Catalog.Handler("language", st.Params.Language)
	if err != nil {
		return nil, err
	}
	run, fresh, err := s.resumeAutofixRun(ctx, sess, h)
	if err != nil {
		return nil, err
	}
	return s.driveAutofix(ctx, sess, run, h, nil, &opts, func(l *autofix.Loop) error {
		l.Runner.(*autofixRunner).fresh = fresh
		return l.Submit(ctx, st, ans, apitypes.ProviderClient)
	})
}

// AutofixStatus reports a loop: running, waiting for a fix, or finished.
func (s *Service) AutofixStatus(ctx context.Context, id string) (*AutofixResult, error) {
	s.autofixReady()
	s.expireAutofixSessions(ctx)
	if !autofixIDRE.MatchString(id) {
		return nil, errdefs.Invalidf("autofix_id: malformed %q", id)
	}
	sess, _, err := s.loadAutofix(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.autofixResult(sess), nil
}

func (s *Service) autofixResult(sess *autofixSession) *AutofixResult {
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
func (s *Service) driveAutofix(ctx context.Context, sess *autofixSession, run *pipeline.CodeRun, h *lang.Handler,
	provider autofix.Provider, opts *CallOptions, step func(*autofix.Loop) error) (*AutofixResult, error) {
	st := sess.State
	runner := &autofixRunner{s: s, run: run, h: h, sess: sess, opts: opts}
	loop := &autofix.Loop{Runner: runner, Provider: provider,
		OnEvent: func(ev apitypes.AutofixEvent) {
			s.o.Sandboxes.PublishAutofix(sess.SandboxID, ev)
			if opts.OnEvent != nil {
				opts.OnEvent(ev)
			}
		},
		OnProgress: func(st *autofix.State) {
			if err := run.Record.WriteJSON(runs.FixedAttemptsJSON, st.Records); err != nil {
				s.log.Warn("autofix: write fixed attempts", "autofix", st.ID, "err", err)
			}
			if err := s.saveAutofix(context.WithoutCancel(ctx), sess, run); err != nil {
				s.log.Warn("autofix: save session", "autofix", st.ID, "err", err)
			}
		},
	}
	loopErr := step(loop)
	wctx := context.WithoutCancel(ctx)
	if st.Status == apitypes.AutofixNeedsFix {
		sess.ExpiresAt = time.Now().Add(s.o.Config.SessionTTL.D())
		sess.Meta = run.Meta
		if err := run.Record.Close(); err != nil {
			s.log.Warn("autofix: close run logs", "run", run.Record.ID, "err", err)
		}
		if err := s.saveAutofix(wctx, sess, run); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "save autofix session")
		}
		return s.autofixResult(sess), nil
	}
	s.finishAutofix(wctx, sess, run)
	if loopErr != nil && len(st.Attempts) == 0 {
		return nil, loopErr
	}
	return s.autofixResult(sess), nil
}

// finishAutofix writes the record's metadata (success is the loop's),
// removes the loop's sandbox, stores the final state and counts the loop.
func (s *Service) finishAutofix(ctx context.Context, sess *autofixSession, run *pipeline.CodeRun) {
	st := sess.State
	if err := run.Record.WriteJSON(runs.FixedAttemptsJSON, st.Records); err != nil {
		s.log.Warn("autofix: write fixed attempts", "autofix", st.ID, "err", err)
	}
	var res *apitypes.RunResult
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
		s.log.Error("autofix: write run record", "run", run.Record.ID, "err", err)
	}
	s.terminateAutofixSandbox(ctx, sess.SandboxID, st.ID)
	sess.ExpiresAt = time.Time{}
	if err := s.saveAutofix(ctx, sess, run); err != nil {
		s.log.Error("autofix: save session", "autofix", st.ID, "err", err)
	}
	m := s.autofixInit()
	outcome := st.StopReason
	if st.Status == apitypes.AutofixFixed {
		outcome = "fixed"
		m.attempts.Observe(float64(len(st.Attempts)))
		m.timeToFix.Observe(st.Used.Seconds())
	}
	m.runs.WithLabelValues(outcome).Inc()
	s.log.Info("autofix finished", "autofix", st.ID, "run", run.Record.ID, "status", st.Status,
		"reason", st.StopReason, "attempts", len(st.Attempts), "provider", st.Params.Provider)
}

func (s *Service) terminateAutofixSandbox(ctx context.Context, sandboxID, id string) {
	if sandboxID == "" {
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := s.o.Lifecycle.TerminateSandbox(tctx, sandboxID); err != nil && errdefs.CodeOf(err) != errdefs.NotFound && errdefs.CodeOf(err) != errdefs.Conflict {
		s.log.Error("autofix: terminate sandbox", "sandbox", sandboxID, "autofix", id, "err", err)
	}
}

func (s *Service) saveAutofix(ctx context.Context, sess *autofixSession, run *pipeline.CodeRun) error {
	if run != nil {
		sess.Meta = run.Meta
	}
	raw, err := json.Marshal(sess)
	if err != nil {
		return err
	}
	now := time.Now()
	return s.o.Store.PutAutofixSession(ctx, &store.AutofixSession{
		ID: sess.State.ID, RunID: sess.State.RunID, SandboxID: sess.SandboxID, Status: sess.State.Status,
		CreatedAt: sess.StartedAt, UpdatedAt: now, ExpiresAt: sess.ExpiresAt, State: raw,
	})
}

func (s *Service) loadAutofix(ctx context.Context, id string) (*autofixSession, *store.AutofixSession, error) {
	row, err := s.o.Store.GetAutofixSession(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !s.o.Sandboxes.Visible(ctx, row.SandboxID)) {
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
func (s *Service) resumeAutofixRun(ctx context.Context, sess *autofixSession, h *lang.Handler) (*pipeline.CodeRun, bool, error) {
	rs, err := s.o.Pipeline.Records()
	if err != nil {
		return nil, false, err
	}
	rec, err := rs.Reopen(sess.State.RunID, sess.StartedAt)
	if err != nil {
		return nil, false, errdefs.Wrap(errdefs.Internal, err, "reopen run record")
	}
	meta := sess.Meta
	fresh := false
	sb, err := s.o.Sandboxes.Get(ctx, sess.SandboxID)
	if err != nil || !(sb.State == sandbox.StateReady || sb.State == sandbox.StateRunning) {
		if sb, err = s.o.Lifecycle.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: h.Name, Network: sess.Network,
			Labels: map[string]string{"sandboxd.autofix": sess.State.ID}}); err != nil {
			_ = rec.Close()
			return nil, false, err
		}
		sess.SandboxID, fresh = sb.ID, true
		meta.SandboxID, meta.ImageDigest = sb.ID, sb.ImageDigest
	}
	return s.o.Pipeline.Resume(rec, h, meta, sb), fresh, nil
}

// expireAutofixSessions ends the needs_fix sessions nobody answered in
// time: their record is finished and their sandbox removed.
func (s *Service) expireAutofixSessions(ctx context.Context) {
	// Finished loops' rows go with the run records' age limit.
	if age := s.o.RecordsMaxAge; age > 0 {
		if _, err := s.o.Store.DeleteAutofixSessions(ctx, time.Now().Add(-age)); err != nil {
			s.log.Warn("autofix: session retention", "err", err)
		}
	}
	rows, err := s.o.Store.ExpiredAutofixSessions(ctx, apitypes.AutofixNeedsFix, time.Now())
	if err != nil {
		s.log.Warn("autofix: list expired sessions", "err", err)
		return
	}
	for _, row := range rows {
		func() {
			unlock := s.autofixLock(row.ID)
			defer unlock()
			sess, _, err := s.loadAutofix(ctx, row.ID)
			if err != nil || sess.State.Status != apitypes.AutofixNeedsFix {
				return
			}
			h, _, err := s.o.Catalog.Handler("language", sess.State.Params.Language)
			if err != nil {
				return
			}
			(&autofix.Loop{}).Expire(sess.State)
			run, _, err := s.resumeAutofixRunNoSandbox(sess, h)
			if err != nil {
				s.log.Warn("autofix: expire", "autofix", row.ID, "err", err)
				return
			}
			s.finishAutofix(context.WithoutCancel(ctx), sess, run)
		}()
	}
}

// resumeAutofixRunNoSandbox reopens the record of a loop that is ending
// without another attempt.
func (s *Service) resumeAutofixRunNoSandbox(sess *autofixSession, h *lang.Handler) (*pipeline.CodeRun, bool, error) {
	rs, err := s.o.Pipeline.Records()
	if err != nil {
		return nil, false, err
	}
	rec, err := rs.Reopen(sess.State.RunID, sess.StartedAt)
	if err != nil {
		return nil, false, err
	}
	return s.o.Pipeline.Resume(rec, h, sess.Meta, nil), false, nil
}

// autofixRunner is the loop's Runner: one pipeline attempt in the loop's
// sandbox, then the test step under the tests rule.
type autofixRunner struct {
	s     *Service
	run   *pipeline.CodeRun
	h     *lang.Handler
	sess  *autofixSession
	opts  *CallOptions
	fresh bool // a new sandbox: install and write everything
}

func (r *autofixRunner) RunAttempt(ctx context.Context, req autofix.AttemptRequest) (*apitypes.RunResult, error) {
	ctx, span := telemetry.Start(ctx, "autofix.attempt", telemetry.KeyAttempt.Int(req.Attempt), telemetry.Sandbox(r.run.Sandbox.ID))
	res, err := r.runAttempt(ctx, req)
	if res != nil {
		span.SetAttributes(attribute.Bool("sandboxd.success", res.Success))
	}
	return res, telemetry.End(span, err)
}

func (r *autofixRunner) runAttempt(ctx context.Context, req autofix.AttemptRequest) (*apitypes.RunResult, error) {
	for _, name := range req.Removed {
		if err := r.s.o.Sandboxes.DeleteFile(ctx, r.run.Sandbox.ID, lang.Workspace+"/"+name, false); err != nil && errdefs.CodeOf(err) != errdefs.NotFound {
			return nil, fmt.Errorf("remove %s: %w", name, err)
		}
	}
	r.run.SetDeadline(req.Deadline)
	var stdin []byte
	if r.sess.Stdin != "" {
		stdin = []byte(r.sess.Stdin)
	}
	a := pipeline.Attempt{Number: req.Attempt, Files: req.Files, Main: req.Entrypoint, Args: r.sess.Args, Stdin: stdin,
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
			vars := lang.Vars{Path: ".", File: ".", Out: r.run.BuildDir(), Files: r.h.Sources(req.Files.Names())}
			argv = lang.Expand(r.h.Tasks["test"], vars)
		}
		st, err := r.run.Step(ctx, &a, res, autofix.StepTest, argv)
		if err != nil {
			return nil, err
		}
		res.Success = pipeline.StepOK(st)
	}
	return res, nil
}

// maxExportFile caps a file's content in an exported correction.
const maxExportFile = 1 << 20

// ExportCorrections writes the corrections of every autofix run record,
// newest run first: for each fix (or refused answer), the code it was
// given, the error, the fix as a diff and what came of it — a data set of
// corrections (sandboxctl runs export --format jsonl).
func (s *Service) ExportCorrections(ctx context.Context, emit func(apitypes.CorrectionRecord) error) error {
	rs, err := s.o.Pipeline.Records()
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
