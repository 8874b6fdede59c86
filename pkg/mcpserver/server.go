// Package mcpserver serves SandboxRunner's MCP tools (docs/SPEC.md "MCP tools")
// with github.com/mark3labs/mcp-go, over streamable HTTP (NewHandler), stdio
// (ServeStdio) and, for `mcp-sandboxd stdio` next to a running daemon, a
// bridge that carries stdio messages to the daemon's /mcp endpoint (Bridge).
//
// Every tool is a thin adapter over one pkg/engine method: it decodes and
// type-checks the arguments, calls the engine and shapes the answer as
// structured content (matching the tool's output schema), a readable
// summary and the structured content as JSON text (for clients that read
// only text). A failed operation is a tool result with isError: true whose
// text is "code: message" and then {"error": {"code", "message"}}, the code
// taken from pkg/errdefs — never a JSON-RPC error. Results stay under server.mcp_max_result_bytes: longer
// output is cut in the middle with a marker that says where the rest is.
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// Name is the server name MCP clients see.
const Name = "mcp-sandboxd"

// SessionLabel is the label that sandboxes created over MCP carry: the id
// of the MCP session that created them.
const SessionLabel = "mcp.session"

// sessionIdleTTL is how long an HTTP session may stay silent before the
// server forgets it (and, with mcp_on_session_end: terminate, terminates
// its sandboxes).
const sessionIdleTTL = time.Hour

// Options configure the MCP server. Zero fields take the engine's
// configuration (server.tools, server.mcp_max_result_bytes,
// server.mcp_on_session_end).
type Options struct {
	// Log receives tool failures with their internal causes; nil means
	// slog.Default(). In stdio mode it must not write to stdout.
	Log *slog.Logger
	// Tools are the enabled tool groups (config.ToolGroups).
	Tools []string
	// MaxResultBytes caps one tool result as a client hands it to its
	// model: the summary and one copy of the structured content.
	MaxResultBytes int
	// OnSessionEnd is config.SessionEndKeep or config.SessionEndTerminate.
	OnSessionEnd string
	// ProgressInterval is how long a call may stay silent before the
	// client is told it still runs (server.mcp_progress_interval).
	ProgressInterval time.Duration
	// Audit, if not nil, records calls of tools that change anything
	// (audit.go).
	Audit *audit.Log
	// TaskTTL is how long a task of the 2026-07-28 tasks extension and its
	// result are kept (exttasks.go); its work is stopped then too. 0 means
	// one hour.
	TaskTTL time.Duration
	// MaxTasksPerKey bounds the extension's tasks one API key holds; 0
	// means 64.
	MaxTasksPerKey int
	// ApprovalTimeout bounds the wait for a client's answer to a network
	// approval (elicit.go); 0 means two minutes.
	ApprovalTimeout time.Duration
	// Replays, if not nil, serves run_replay (group run).
	Replays pipeline.Replays
	// Webhooks, if not nil, is the lifecycle webhook service: the
	// webhook_* tools (tools_webhooks.go), in group sandbox.
	Webhooks webhooks.Webhooks
}

func (o Options) withDefaults(cfg *config.Config) Options {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Tools == nil {
		o.Tools = cfg.Server.Tools
	}
	if o.MaxResultBytes <= 0 {
		o.MaxResultBytes = int(cfg.Server.MCPMaxResultBytes)
	}
	if o.MaxResultBytes < 4<<10 {
		o.MaxResultBytes = 48 << 10
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = time.Duration(cfg.Server.MCPProgressInterval)
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 15 * time.Second
	}
	if o.OnSessionEnd == "" {
		o.OnSessionEnd = cfg.Server.MCPOnSessionEnd
	}
	return o
}

// instructions tell an agent how to start.
const instructions = `mcp-sandboxd runs code in isolated Linux sandboxes (no network by default).

How to start:
1. languages_list shows the languages, their file extensions, tasks (lint/build/test) and whether their image is ready.
2. For a one-off program call run_code {language, code} (or files {path: content}): it creates a throw-away sandbox, installs dependencies found in the files, compiles, runs and returns every step's exit code and output. Its run_id keeps the full record (run_get).
3. For several steps on the same files call sandbox_create {language}, then file_write / exec_command / run_code {sandbox_id} / run_task / packages_install against the returned sandbox_id, and sandbox_terminate when done (idle sandboxes are reclaimed after a while).
4. Before a risky change in a sandbox, sandbox_snapshot {sandbox_id} saves its files; sandbox_restore {sandbox_id, snapshot_id} rolls them back, sandbox_create {from_snapshot} starts a copy to try something else.

Long work: exec_command with background: true returns a job_id at once; poll job_status with the returned next offsets until state is "finished". Clients that support MCP tasks may call run_code, exec_command, run_task, packages_install, autofix, agent_run, image_build, image_build_dockerfile, image_pull, sandbox_create and vm_test as tasks (tasks/get, tasks/result, tasks/cancel; clients declaring the 2026-07-28 extension io.modelcontextprotocol/tasks get them as tasks at once: tasks/get, tasks/cancel). Long outputs in results are cut in the middle with a marker saying where the rest is.
Errors come back as isError results with {"error": {"code", "message"}}; codes: invalid_argument (fix the input), not_found, conflict (e.g. the sandbox is terminated: create a new one), limit_exceeded, unavailable, internal.`

// srv is the state the tool handlers share.
type srv struct {
	e   Engine
	cfg *config.Config
	opt Options
	log *slog.Logger
	mcp *server.MCPServer
	// outputs is each tool's output type, from which its output schema
	// is generated: the contract test checks that it is pkg/apitypes'.
	outputs map[string]reflect.Type
	// tasks are the running tasks' detached contexts (tasks.go).
	tasks *taskRuns
	// extTasks are the tasks of the 2026-07-28 tasks extension
	// (exttasks.go).
	extTasks *extTaskStore
	// approvals are the hosts asked about through elicitation (elicit.go).
	approvals approvals
}

// NewServer returns the MCP server over e with the enabled tool groups.
func NewServer(e Engine, opt Options) *server.MCPServer {
	return newSrv(e, opt).mcp
}

func newSrv(e Engine, opt Options) *srv {
	cfg := e.Config()
	opt = opt.withDefaults(cfg)
	s := &srv{e: e, cfg: cfg, opt: opt, log: opt.Log, outputs: map[string]reflect.Type{}, tasks: newTaskRuns(),
		extTasks: newExtTaskStore(opt.TaskTTL, opt.MaxTasksPerKey)}
	hooks := &server.Hooks{}
	hooks.AddBeforeCallTool(boundTaskTTL)
	// The tasks extension is of revision 2026-07-28 (exttasks.go serves
	// only requests of it); mcp-go would declare it in every revision's
	// initialize too, so it is taken out there.
	hooks.AddAfterInitialize(func(_ context.Context, _ any, _ *mcp.InitializeRequest, res *mcp.InitializeResult) {
		delete(res.Capabilities.Extensions, extTasksID)
		if len(res.Capabilities.Extensions) == 0 {
			res.Capabilities.Extensions = nil
		}
	})
	hooks.AddOnUnregisterSession(func(ctx context.Context, sess server.ClientSession) {
		s.sessionEnded(ctx, sess.SessionID())
	})
	s.mcp = server.NewMCPServer(Name, version.Version,
		// Declared honestly: tools, tasks for tools/call (tasks.go: list
		// and cancel too), and resources (run record logs, when the run
		// group is on). No logging to clients, prompts, completions or
		// subscriptions.
		server.WithToolCapabilities(false),
		server.WithTaskCapabilities(true, true, true),
		server.WithTaskHooks(s.taskHooks()),
		// The 2026-07-28 tasks extension, served beside mcp-go by the
		// HTTP middleware NewHandler puts in front of it (exttasks.go);
		// declared in server/discover (2026-07-28) only.
		server.WithExtensions(map[string]any{extTasksID: map[string]any{}}),
		server.WithRecovery(),
		server.WithInstructions(instructions),
		server.WithHooks(hooks),
		server.WithLogger(slog.New(quieter{opt.Log.Handler()})),
	)
	enabled := func(groups ...string) bool {
		for _, g := range groups {
			if slices.Contains(opt.Tools, g) {
				return true
			}
		}
		return false
	}
	if enabled("sandbox") {
		s.addSandboxTools()
		s.addPauseTools()
		s.addPortTools()
		s.addSnapshotTools()
		s.addVolumeTools()
		s.addTemplateTools()
	}
	if enabled("sandbox", "run") {
		s.addLanguagesTool()
	}
	if enabled("sandbox") {
		s.addQuotaTool()
		if opt.Webhooks != nil {
			s.addWebhookTools()
		}
	}
	if enabled("exec") {
		s.addExecTools()
	}
	if enabled("files") {
		s.addFileTools()
	}
	if enabled("run") {
		s.addRunTools()
		s.addReplayTool()
		s.addRunResources()
		s.addAgentTools()
	}
	if enabled("images") {
		s.addImageTools()
	}
	if enabled("autofix") {
		s.addAutofixTools()
	}
	if enabled("vm") {
		s.addVMTools()
	}
	return s
}

// sessionEnded terminates the sandboxes session id created, when the
// configuration says so.
func (s *srv) sessionEnded(ctx context.Context, id string) {
	if id == "" || s.opt.OnSessionEnd != config.SessionEndTerminate {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	ids, err := s.e.TerminateLabeled(ctx, SessionLabel, id, "its MCP session ended")
	for _, sb := range ids {
		s.log.Info("mcp session ended: terminated its sandbox", "session", id, "sandbox", sb)
	}
	if err != nil {
		s.log.Error("mcp session end: terminate its sandboxes", "session", id, "err", err)
	}
}

// NewHandler returns the streamable-HTTP MCP endpoint over e, to be mounted
// at /mcp. It does no authentication: mount it behind the bearer-token check
// on TCP, bare on the unix socket (whose file mode is the access control).
// mcp-go's DNS-rebinding protection for loopback connections stays on.
func NewHandler(e Engine, opt Options) http.Handler {
	s := newSrv(e, opt)
	sessions := newIssuedSessions()
	h := server.NewStreamableHTTPServer(s.mcp,
		server.WithStreamableHTTPLogger(s.log),
		server.WithSessionIdleTTL(sessionIdleTTL),
		server.WithSessionIdManager(sessions),
	)
	return flushable(refuseUnknownSessions(sessions, s.withExtTasks(withRequestStreams(withTaskSlots(h)))))
}

// flushable restores http.Flusher on response writers that middleware
// wrapped without it (mcp-go streams SSE only through an http.Flusher),
// reaching the real writer through Unwrap like http.ResponseController.
func flushable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			w = &flushWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
		}
		next.ServeHTTP(w, r)
	})
}

type flushWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (f *flushWriter) Flush() { _ = f.rc.Flush() }

func (f *flushWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// limits describes the configured command time limits for tool descriptions.
func (s *srv) limits() string {
	sc := s.cfg.Sandbox
	return fmt.Sprintf("default timeout %s, at most %s", sc.ExecTimeout, sc.MaxExecTimeout)
}

func boolp(b bool) *bool { return &b }

// quieter logs mcp-go's per-request info lines at debug level.
type quieter struct{ slog.Handler }

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool {
	if l == slog.LevelInfo {
		l = slog.LevelDebug
	}
	return q.Handler.Enabled(ctx, l)
}

func (q quieter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	return q.Handler.Handle(ctx, r)
}

func (q quieter) WithAttrs(a []slog.Attr) slog.Handler { return quieter{q.Handler.WithAttrs(a)} }

func (q quieter) WithGroup(n string) slog.Handler { return quieter{q.Handler.WithGroup(n)} }

// annotations are a tool's behaviour hints.
type annotations struct{ readOnly, destructive, idempotent bool }

func (a annotations) options(title string) []mcp.ToolOption {
	return []mcp.ToolOption{mcp.WithToolAnnotation(mcp.ToolAnnotation{
		Title:           title,
		ReadOnlyHint:    boolp(a.readOnly),
		DestructiveHint: boolp(a.destructive),
		IdempotentHint:  boolp(a.idempotent),
		OpenWorldHint:   boolp(false),
	})}
}

func joinLines(lines ...string) string { return strings.Join(lines, "\n") }
