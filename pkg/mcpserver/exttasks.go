package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The 2026-07-28 tasks extension, io.modelcontextprotocol/tasks (docs/SPEC.md
// "Tasks", docs/mcp.md). mcp-go v1.2.1 speaks the tasks of revision
// 2025-11-25 (tasks.go) but not this extension, whose wire differs in every
// message: the client declares it per request in
// _meta["io.modelcontextprotocol/clientCapabilities"].extensions, the server
// decides per call and answers {resultType: "task", taskId, status, ttlMs,
// pollIntervalMs}, tasks/get returns the task with the final result (or
// JSON-RPC error) inline, tasks/update carries input responses, tasks/cancel
// answers an empty result, and there is no tasks/list and no tasks/result.
// The method names tasks/get and tasks/cancel are the same as 2025-11-25's,
// so the two are told apart by the declaration in the request's _meta.
//
// It lives here, as an HTTP middleware in front of mcp-go's streamable-HTTP
// handler (stdio reaches the same handler through the bridge), because that
// is the narrowest seam that sees what mcp-go does not let a hook change:
// a hook can observe a tools/call but not answer it with another result
// shape, and tasks/get of this wire cannot reach mcp-go's own tasks/get
// handler, which would answer the 2025-11-25 shape. Everything else stays
// mcp-go's: the task's work is the unchanged tools/call, replayed through
// the same handler chain under a context detached from the POST (the
// caller's principal, tenant, quota and audit as for a synchronous call),
// its answer captured and kept as the task's result.

// extTasksID names the extension in capabilities.
const extTasksID = "io.modelcontextprotocol/tasks"

const (
	// metaClientCapabilities and metaProgressToken are the _meta keys the
	// middleware reads.
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	metaProgressToken      = "progressToken"

	// extTaskPoll is the pollIntervalMs the server suggests: a sandbox call
	// worth a task runs for seconds at least.
	extTaskPoll = time.Second
	// extTaskMaxPerKey bounds the tasks (running or finished and kept) one
	// API key holds; a finished task makes room for a new one.
	extTaskMaxPerKey = 64
	// extTaskIDPrefix marks the ids this store hands out; 2025-11-25 task
	// ids are mcp-go's bare UUIDs.
	extTaskIDPrefix = "task-"
	// maxTaskIDLen bounds a task id before it is looked up or echoed.
	maxTaskIDLen = 128
)

// extTaskStatus is a task's status as the extension names it.
type extTaskStatus string

const (
	extWorking   extTaskStatus = "working"
	extCompleted extTaskStatus = "completed"
	extFailed    extTaskStatus = "failed"
	extCancelled extTaskStatus = "cancelled"
)

func (s extTaskStatus) terminal() bool { return s != extWorking }

// extTask is one task of the extension.
type extTask struct {
	id      string
	owner   string
	tool    string
	created time.Time
	updated time.Time
	status  extTaskStatus
	message string
	// result is the tools/call result (completed); rpcErr the JSON-RPC
	// error the call ended with (failed).
	result json.RawMessage
	rpcErr json.RawMessage
	cancel context.CancelFunc
	expiry *time.Timer
}

// extTaskStore holds the extension's tasks: in memory, as mcp-go holds the
// 2025-11-25 ones (a daemon restart forgets both; the sandboxes of their
// work end with it). Bounded per key and in time: a task is deleted — and
// its work stopped — at its TTL.
type extTaskStore struct {
	mu     sync.Mutex
	tasks  map[string]*extTask
	owners map[string]int
	ttl    time.Duration
	max    int
}

func newExtTaskStore(ttl time.Duration, maxPerKey int) *extTaskStore {
	if ttl <= 0 {
		ttl = taskDefaultTTL
	}
	if maxPerKey <= 0 {
		maxPerKey = extTaskMaxPerKey
	}
	return &extTaskStore{tasks: map[string]*extTask{}, owners: map[string]int{}, ttl: ttl, max: maxPerKey}
}

// ownerOf names the caller a task belongs to: its API key, or for callers
// without one (the unix socket) its principal's name. Only that caller
// sees the task (the extension's "auth binding"); a task id is also
// unguessable (a random UUID).
func ownerOf(ctx context.Context) string {
	p, _ := principal.From(ctx)
	if p.KeyID != "" {
		return "key:" + p.KeyID
	}
	return "name:" + p.KeyName + "/" + p.Tenant
}

// create registers a working task for owner, making room by dropping the
// owner's oldest finished task when it holds the maximum.
func (st *extTaskStore) create(owner, tool string, cancel context.CancelFunc) (*extTask, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.owners[owner] >= st.max {
		var oldest *extTask
		for _, t := range st.tasks {
			if t.owner == owner && t.status.terminal() && (oldest == nil || t.updated.Before(oldest.updated)) {
				oldest = t
			}
		}
		if oldest == nil {
			return nil, errdefs.LimitExceededf("tasks: this key has %d tasks running, at most %d: wait for one to finish or cancel one (tasks/cancel)", st.owners[owner], st.max)
		}
		st.removeLocked(oldest)
	}
	now := time.Now().UTC()
	t := &extTask{id: extTaskIDPrefix + uuid.NewString(), owner: owner, tool: tool, created: now, updated: now,
		status: extWorking, cancel: cancel}
	st.tasks[t.id] = t
	st.owners[owner]++
	t.expiry = time.AfterFunc(st.ttl, func() { st.expire(t) })
	return t, nil
}

func (st *extTaskStore) removeLocked(t *extTask) {
	if st.tasks[t.id] != t {
		return
	}
	delete(st.tasks, t.id)
	if st.owners[t.owner]--; st.owners[t.owner] <= 0 {
		delete(st.owners, t.owner)
	}
	t.expiry.Stop()
	t.cancel()
}

// expire deletes t at its TTL and stops its work: nobody could fetch a
// result after it.
func (st *extTaskStore) expire(t *extTask) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.removeLocked(t)
}

// get returns a copy of owner's task id.
func (st *extTaskStore) get(owner, id string) (extTask, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t, ok := st.tasks[id]
	if !ok || t.owner != owner {
		return extTask{}, false
	}
	return *t, true
}

// finish records the end of t's work, unless t already ended (cancelled).
func (st *extTaskStore) finish(t *extTask, status extTaskStatus, message string, result, rpcErr json.RawMessage) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if t.status.terminal() {
		return
	}
	t.status, t.message, t.result, t.rpcErr, t.updated = status, message, result, rpcErr, time.Now().UTC()
}

// cancelTask stops owner's task id: its status is cancelled at once and its
// context ends, which stops the tool (the sandbox's processes are killed,
// a throw-away sandbox is terminated). A finished task keeps its status.
func (st *extTaskStore) cancelTask(owner, id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	t, ok := st.tasks[id]
	if !ok || t.owner != owner {
		return false
	}
	if !t.status.terminal() {
		t.status, t.message, t.updated = extCancelled, "cancelled by tasks/cancel", time.Now().UTC()
	}
	t.cancel()
	return true
}

// wire is t as tasks/get and the task handle carry it.
func (st *extTaskStore) wire(t extTask, resultType string) map[string]any {
	m := map[string]any{
		"resultType":     resultType,
		"taskId":         t.id,
		"status":         t.status,
		"createdAt":      t.created.Format(time.RFC3339Nano),
		"lastUpdatedAt":  t.updated.Format(time.RFC3339Nano),
		"ttlMs":          st.ttl.Milliseconds(),
		"pollIntervalMs": extTaskPoll.Milliseconds(),
	}
	if t.message != "" {
		m["statusMessage"] = t.message
	}
	switch t.status {
	case extCompleted:
		m["result"] = t.result
	case extFailed:
		m["error"] = t.rpcErr
	}
	return m
}

// extTaskToolWanted says whether a call of tool with args runs as a task
// for a client that declared the extension: the long tools (taskTools),
// except what answers at once anyway — a sandbox_create that is not a VM,
// an exec_command with background: true.
func extTaskToolWanted(tool string, args json.RawMessage) bool {
	if !taskTools[tool] {
		return false
	}
	var a struct {
		Backend    string `json:"backend"`
		Background bool   `json:"background"`
	}
	_ = json.Unmarshal(args, &a)
	switch tool {
	case "sandbox_create":
		return a.Backend == "vm"
	case "exec_command":
		return !a.Background
	}
	return true
}

// rpcMessage is a JSON-RPC request as the middleware reads it: only what it
// needs, the rest kept raw so a replayed request is the client's own.
type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// declaresExtTasks reads a request's _meta: whether it declares the
// extension, and whether it is of revision 2026-07-28 or later.
func declaresExtTasks(params json.RawMessage) (declared, modern bool) {
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil || p.Meta == nil {
		return false, false
	}
	var v string
	if json.Unmarshal(p.Meta[mcp.MetaKeyProtocolVersion], &v) == nil {
		modern = mcp.IsModernProtocol(v)
	}
	var caps struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	if json.Unmarshal(p.Meta[metaClientCapabilities], &caps) == nil {
		raw := bytes.TrimSpace(caps.Extensions[extTasksID])
		declared = len(raw) > 0 && raw[0] == '{'
	}
	return declared, modern
}

// maxRequestBody bounds the body the middleware reads to route a request;
// mcp-go reads the same body whole.
const maxRequestBody = 64 << 20

// withExtTasks serves the extension in front of next (mcp-go's handler and
// the middleware under it): task-augmented tools/call of clients that
// declared it, and tasks/get, tasks/update, tasks/cancel of such clients.
// Everything else goes to next unchanged — among it every request of
// clients that did not declare the extension, which get today's behaviour
// (and 2025-11-25 tasks from mcp-go).
func (s *srv) withExtTasks(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := readBody(io.LimitReader(r.Body, maxRequestBody+1))
		if err != nil {
			// A body that could not be read (one over
			// server.max_request_bytes, cut by the handler's cap): mcp-go
			// answers the read error as it answers one, without reading a
			// second copy of what was read here (a daemon under a stream of
			// such requests holds one cap's worth each, not two).
			body = nil
			r.Body = readCloser{errReader{err}, r.Body}
			next.ServeHTTP(w, r)
			return
		}
		if len(body) > maxRequestBody {
			// Not ours to route: mcp-go reads the whole body as it would
			// have.
			r.Body = readCloser{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
			next.ServeHTTP(w, r)
			return
		}
		_ = r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m rpcMessage
		if json.Unmarshal(body, &m) != nil || len(m.ID) == 0 || string(m.ID) == "null" {
			next.ServeHTTP(w, r)
			return
		}
		switch m.Method {
		case string(mcp.MethodToolsCall), "tasks/get", "tasks/update", "tasks/cancel":
		default:
			next.ServeHTTP(w, r)
			return
		}
		declared, modern := declaresExtTasks(m.Params)
		if declared && !modern {
			// Per-request capabilities are of revision 2026-07-28, and so
			// is the extension: an earlier revision's request that
			// declares it anyway is served as before (the server decides,
			// and 2025-11-25 tasks are mcp-go's).
			declared = false
		}
		if m.Method == string(mcp.MethodToolsCall) {
			var p struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
				Task      json.RawMessage `json:"task"`
			}
			// A call with params.task asks for a 2025-11-25 task: mcp-go's.
			if !declared || json.Unmarshal(m.Params, &p) != nil || len(p.Task) > 0 || !extTaskToolWanted(p.Name, p.Arguments) {
				next.ServeHTTP(w, r)
				return
			}
			s.startExtTask(w, r, next, &m, p.Name)
			return
		}
		if !declared {
			if modern {
				// A 2026-07-28 client that did not declare the extension
				// has no tasks (and 2025-11-25's are not of its revision).
				writeRPCError(w, modern, m.ID, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability: "+m.Method+" needs the "+extTasksID+" extension declared in _meta",
					map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{extTasksID: map[string]any{}}}})
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		s.serveExtTaskMethod(w, r, &m, modern)
	})
}

// readCloser is a body put back together: what was read, then the rest.
type readCloser struct {
	io.Reader
	io.Closer
}

// readBody reads r to its end in chunks joined only once it is all in:
// a body cut by the handler's cap (an error) leaves one copy of what was
// read as garbage, not the up to twice as much of io.ReadAll's doubling.
func readBody(r io.Reader) ([]byte, error) {
	const chunk = 64 << 10
	var chunks [][]byte
	for {
		b := make([]byte, chunk)
		n, err := io.ReadFull(r, b)
		if n > 0 {
			chunks = append(chunks, b[:n])
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	return bytes.Join(chunks, nil), nil
}

// errReader answers every Read with err: a body whose reading failed.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// serveExtTaskMethod answers tasks/get, tasks/update and tasks/cancel.
func (s *srv) serveExtTaskMethod(w http.ResponseWriter, r *http.Request, m *rpcMessage, modern bool) {
	id, err := taskIDParam(m.Params)
	if err == nil && r.Header.Get(mcp.HeaderName) != "" && r.Header.Get(mcp.HeaderName) != id {
		// The transport's routing header must name the same task (the
		// extension: Mcp-Name is params.taskId), or an intermediary would
		// route one task's request by another's id.
		writeRPCError(w, modern, m.ID, mcp.HEADER_MISMATCH, fmt.Sprintf("%s header %q does not match params.taskId %q", mcp.HeaderName, r.Header.Get(mcp.HeaderName), id), nil)
		return
	}
	if err == nil && m.Method == "tasks/update" {
		var p struct {
			InputResponses json.RawMessage `json:"inputResponses"`
		}
		_ = json.Unmarshal(m.Params, &p)
		if raw := bytes.TrimSpace(p.InputResponses); len(raw) == 0 || raw[0] != '{' {
			err = errdefs.Invalidf("inputResponses: must be an object of responses by input request key")
		}
	}
	if err != nil {
		writeTaskError(w, modern, m.ID, err)
		return
	}
	owner := ownerOf(r.Context())
	notFound := errdefs.NotFoundf("taskId: no task %q for this caller (it never existed, expired after its ttlMs, or belongs to another key)", id)
	switch m.Method {
	case "tasks/get":
		t, ok := s.extTasks.get(owner, id)
		if !ok {
			writeTaskError(w, modern, m.ID, notFound)
			return
		}
		writeRPCResult(w, m.ID, s.extTasks.wire(t, "complete"))
	case "tasks/update":
		// This server never asks for input (no task is input_required):
		// the extension says to ignore responses to keys not outstanding.
		if _, ok := s.extTasks.get(owner, id); !ok {
			writeTaskError(w, modern, m.ID, notFound)
			return
		}
		writeRPCResult(w, m.ID, map[string]any{"resultType": "complete"})
	case "tasks/cancel":
		if !s.extTasks.cancelTask(owner, id) {
			writeTaskError(w, modern, m.ID, notFound)
			return
		}
		writeRPCResult(w, m.ID, map[string]any{"resultType": "complete"})
	}
}

// taskIDParam reads and checks params.taskId.
func taskIDParam(params json.RawMessage) (string, error) {
	var p map[string]json.RawMessage
	if raw := bytes.TrimSpace(params); len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &p) != nil {
		return "", errdefs.Invalidf("params: must be an object with taskId")
	}
	raw, ok := p["taskId"]
	if !ok {
		return "", errdefs.Invalidf("taskId: required")
	}
	var id string
	if json.Unmarshal(raw, &id) != nil {
		return "", errdefs.Invalidf("taskId: must be a string")
	}
	switch {
	case id == "":
		return "", errdefs.Invalidf("taskId: must not be empty")
	case len(id) > maxTaskIDLen:
		return "", errdefs.Invalidf("taskId: longer than %d bytes", maxTaskIDLen)
	case !utf8.ValidString(id) || strings.IndexFunc(id, func(r rune) bool { return r < 0x21 || r == 0x7f }) >= 0:
		return "", errdefs.Invalidf("taskId: must be printable without spaces")
	}
	return id, nil
}

// startExtTask answers a tools/call with a task handle and runs the call in
// the background: the same request, through next, under a context that
// outlives the POST — with the POST's values (principal, origin, session,
// trace) — and ends at tasks/cancel or the TTL.
func (s *srv) startExtTask(w http.ResponseWriter, r *http.Request, next http.Handler, m *rpcMessage, tool string) {
	work, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.extTasks.ttl)
	t, err := s.extTasks.create(ownerOf(r.Context()), tool, cancel)
	if err != nil {
		cancel()
		// Over the bound, the call is answered as a synchronous call that
		// failed: a tool result with isError, which every client shows.
		res := s.errorResult(tool, err)
		data, _ := json.Marshal(res)
		var obj map[string]any
		_ = json.Unmarshal(data, &obj)
		obj["resultType"] = "complete"
		writeRPCResult(w, m.ID, obj)
		return
	}
	body, err := replayBody(m)
	if err != nil {
		s.extTasks.finish(t, extFailed, "internal error", nil, rpcErrorJSON(mcp.INTERNAL_ERROR, err.Error(), nil))
	} else {
		inner := r.Clone(work)
		inner.Body = io.NopCloser(bytes.NewReader(body))
		inner.ContentLength = int64(len(body))
		go s.runExtTask(next, inner, t, m.ID)
	}
	s.extTasks.mu.Lock()
	handle := s.extTasks.wire(*t, "task")
	s.extTasks.mu.Unlock()
	writeRPCResult(w, m.ID, handle)
}

// replayBody is the request the task's work sends through the handler: the
// client's own, without its progress token (a task reports no progress:
// its answer went out as the handle).
func replayBody(m *rpcMessage) ([]byte, error) {
	var params map[string]json.RawMessage
	if err := json.Unmarshal(m.Params, &params); err != nil {
		return nil, err
	}
	if rawMeta, ok := params["_meta"]; ok {
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(rawMeta, &meta); err == nil {
			delete(meta, metaProgressToken)
			b, err := json.Marshal(meta)
			if err != nil {
				return nil, err
			}
			params["_meta"] = b
		}
	}
	p, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	return json.Marshal(rpcMessage{JSONRPC: "2.0", ID: m.ID, Method: m.Method, Params: p})
}

// runExtTask runs the task's call and records how it ended.
func (s *srv) runExtTask(next http.Handler, r *http.Request, t *extTask, id json.RawMessage) {
	cw := &captureWriter{header: http.Header{}}
	func() {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("mcp task: the call panicked", "task", t.id, "tool", t.tool, "panic", p)
			}
		}()
		next.ServeHTTP(cw, r)
	}()
	if r.Context().Err() != nil {
		// Cancelled (the status says so already) or past its TTL (the task
		// is being deleted): what the call answered no longer matters.
		s.extTasks.finish(t, extFailed, "stopped at the task's ttlMs", nil, rpcErrorJSON(mcp.INTERNAL_ERROR, "the task's work was stopped at its ttlMs", nil))
		return
	}
	resp, ok := lastResponse(cw.body.Bytes(), id)
	switch {
	case !ok:
		s.log.Error("mcp task: no answer from the call", "task", t.id, "tool", t.tool, "status", cw.status)
		s.extTasks.finish(t, extFailed, "the call gave no answer", nil, rpcErrorJSON(mcp.INTERNAL_ERROR, fmt.Sprintf("the call gave no answer (HTTP %d)", cw.status), nil))
	case len(resp.Error) > 0:
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(resp.Error, &e)
		s.extTasks.finish(t, extFailed, e.Message, nil, resp.Error)
	default:
		var res map[string]json.RawMessage
		if json.Unmarshal(resp.Result, &res) != nil {
			s.extTasks.finish(t, extFailed, "the call's result is not an object", nil, rpcErrorJSON(mcp.INTERNAL_ERROR, "the call's result is not an object", nil))
			return
		}
		// The result is the tools/call result of revision 2026-07-28,
		// which carries resultType (mcp-go sets it on modern requests).
		if _, ok := res["resultType"]; !ok {
			res["resultType"] = json.RawMessage(`"complete"`)
		}
		data, _ := json.Marshal(res)
		msg := "done"
		var flag struct {
			IsError bool `json:"isError"`
		}
		if json.Unmarshal(resp.Result, &flag) == nil && flag.IsError {
			msg = "the tool reported an error (isError)"
		}
		s.extTasks.finish(t, extCompleted, msg, data, nil)
	}
}

// rpcResponse is a JSON-RPC response.
type rpcResponse struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// lastResponse finds the response to id in what the handler wrote: a JSON
// body or an SSE stream (progress and heartbeats before the result).
func lastResponse(body []byte, id json.RawMessage) (rpcResponse, bool) {
	match := func(data []byte) (rpcResponse, bool) {
		var resp rpcResponse
		if json.Unmarshal(data, &resp) != nil || !bytes.Equal(bytes.TrimSpace(resp.ID), bytes.TrimSpace(id)) ||
			(len(resp.Result) == 0 && len(resp.Error) == 0) {
			return rpcResponse{}, false
		}
		return resp, true
	}
	if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '{' {
		return match(trimmed)
	}
	var found rpcResponse
	ok := false
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), maxRequestBody)
	for sc.Scan() {
		line := sc.Bytes()
		if data, cut := bytes.CutPrefix(line, []byte("data:")); cut {
			if resp, hit := match(bytes.TrimSpace(data)); hit {
				found, ok = resp, true
			}
		}
	}
	return found, ok
}

// captureWriter is the ResponseWriter of a task's work: it keeps what the
// handler answers for runExtTask.
type captureWriter struct {
	mu     sync.Mutex
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == 0 {
		c.status = code
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(p)
}

// Flush is what mcp-go needs to stream; nothing is waiting on the other end.
func (c *captureWriter) Flush() {}

// rpcErrorJSON is a JSON-RPC error object.
func rpcErrorJSON(code int, message string, data any) json.RawMessage {
	e := map[string]any{"code": code, "message": message}
	if data != nil {
		e["data"] = data
	}
	b, _ := json.Marshal(e)
	return b
}

// writeTaskError answers a tasks/* request that failed with err: JSON-RPC
// invalid params (what the extension prescribes for an unknown or invalid
// taskId), our code first in the message, and the error object as data.
func writeTaskError(w http.ResponseWriter, modern bool, id json.RawMessage, err error) {
	body := apitypes.ErrorBodyOf(err)
	writeRPCError(w, modern, id, mcp.INVALID_PARAMS, string(body.Code)+": "+body.Message, apitypes.ErrorResponse{Error: body})
}

// writeRPCError writes a JSON-RPC error; to a 2026-07-28 request with the
// HTTP status that revision maps its code to, as mcp-go does.
func writeRPCError(w http.ResponseWriter, modern bool, id json.RawMessage, code int, message string, data any) {
	status := http.StatusOK
	if modern {
		switch code {
		case mcp.HEADER_MISMATCH, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, mcp.INVALID_PARAMS, mcp.INVALID_REQUEST:
			status = http.StatusBadRequest
		}
	}
	writeRPC(w, status, map[string]any{"jsonrpc": "2.0", "id": id, "error": rpcErrorJSON(code, message, data)})
}

func writeRPCResult(w http.ResponseWriter, id json.RawMessage, result any) {
	writeRPC(w, http.StatusOK, map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func writeRPC(w http.ResponseWriter, status int, msg any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(msg)
}
