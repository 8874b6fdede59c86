package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// call is one tool invocation as the handlers see it.
type call struct {
	s       *srv
	req     mcp.CallToolRequest
	session string // MCP session id; "" when the protocol has none
	// progress reports on the running call (nil when the answer cannot
	// carry notifications); stopped before the result is written.
	progress *progressNotifier
}

// result is what a handler returns: the structured content and the readable
// text. Handlers that must fit variable-size output into the budget return
// a result built by fit.
type result struct {
	structured any
	text       string
	// extra are more content blocks after the text (sandbox_screenshot's image).
	extra []mcp.Content
}

// addTool registers tool name with typed input In and output Out. fn does
// the work; its errors become isError results carrying their taxonomy code.
func addTool[In, Out any](s *srv, name, title, description string, a annotations, fn func(ctx context.Context, c *call, in *In) (*result, error)) {
	opts := []mcp.ToolOption{mcp.WithDescription(description), mcp.WithInputSchema[In](), mcp.WithOutputSchema[Out]()}
	opts = append(opts, a.options(title)...)
	if taskTools[name] {
		opts = append(opts, mcp.WithTaskSupport(mcp.TaskSupportOptional))
	}
	tool := mcp.NewTool(name, opts...)
	s.outputs[name] = reflect.TypeFor[Out]()
	required := requiredOf(tool.RawInputSchema)
	s.mcp.AddTool(tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in In
		var res *result
		var err error // the tool's error, for its span
		ctx, span := startToolSpan(ctx, name, req)
		defer func() { endToolSpan(span, &in, resultStructured(res), err) }()
		if err = decodeArgs(req.GetRawArguments(), required, &in); err != nil {
			return s.errorResult(name, err), nil
		}
		c := &call{s: s, req: req}
		if sess := server.ClientSessionFromContext(ctx); sess != nil {
			c.session = sess.SessionID()
		}
		if req.Params.Task != nil {
			// A task's answer went out as its handle: nothing can follow
			// it on that stream, so no progress; tasks/get tells the state.
			var done func()
			ctx, done = s.detachTask(ctx, req)
			defer done()
		} else {
			c.progress = c.newProgress(ctx)
		}
		res, err = fn(ctx, c, &in)
		c.progress.stop()
		s.auditTool(ctx, name, a, &in, resultStructured(res), err)
		if err != nil {
			return s.errorResult(name, err), nil
		}
		return res.toolResult(), nil
	})
}

// resultStructured is a result's structured content (nil for none).
func resultStructured(r *result) any {
	if r == nil {
		return nil
	}
	return r.structured
}

// toolResult shapes a result for every client (docs/mcp.md, measured in
// test/claude and test/clients): the summary, then the structured content
// serialized as JSON in a second text block, as the MCP specification asks
// of a tool with structured content, then any extra blocks. Clients read
// one or the other, never both: Claude Code and Codex CLI hand their model
// structuredContent alone when it is there, Gemini CLI (and MCP
// Inspector's CLI) the text blocks alone. So the budget (fit) counts the
// output once, and every client's model sees all of it.
func (r *result) toolResult() *mcp.CallToolResult {
	data, err := json.Marshal(r.structured)
	if err != nil {
		// Every output type marshals; should one not, the summary still
		// answers and the client's schema check says what is missing.
		data = nil
	}
	content := []mcp.Content{mcp.NewTextContent(r.text)}
	if len(data) > 0 {
		content = append(content, mcp.NewTextContent(string(data)))
	}
	content = append(content, r.extra...)
	return &mcp.CallToolResult{Content: content, StructuredContent: r.structured}
}

// requiredOf reads the required properties of a generated input schema.
func requiredOf(schema json.RawMessage) []string {
	var sch struct {
		Required []string `json:"required"`
	}
	_ = json.Unmarshal(schema, &sch)
	return sch.Required
}

// decodeArgs decodes a tool's arguments into v strictly: required fields
// present and not null, no unknown fields, every value of its field's type.
// Every error is invalid_argument and names the field.
func decodeArgs(raw any, required []string, v any) error {
	var data []byte
	switch r := raw.(type) {
	case nil:
		data = []byte("{}")
	case json.RawMessage:
		data = r
	case []byte:
		data = r
	default:
		var err error
		if data, err = json.Marshal(r); err != nil {
			return errdefs.Invalidf("arguments: %v", err)
		}
	}
	if len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null" {
		data = []byte("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return errdefs.Invalidf("arguments: want a JSON object")
	}
	for _, f := range required {
		if v, ok := fields[f]; !ok || string(v) == "null" {
			return errdefs.Invalidf("%s: required", f)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// The object parsed above, so the decoder cannot meet an empty
		// document: every error is the contract's, worded as REST words it.
		return apitypes.DecodeError("arguments", err)
	}
	return nil
}

// errorResult is the one place where errors become tool results. Internal
// errors are logged with their cause, which the client never sees.
func (s *srv) errorResult(tool string, err error) *mcp.CallToolResult {
	code := errdefs.CodeOf(err)
	if code == errdefs.Internal {
		s.log.Error("mcp tool failed", "tool", tool, "err", err)
	}
	body := apitypes.ErrorBodyOf(err)
	obj, _ := json.Marshal(apitypes.ErrorResponse{Error: body})
	// No structuredContent: clients validate it against the tool's output
	// schema even on errors (the TypeScript SDK does). And the text is not
	// a JSON document: Gemini CLI parses an error's JSON text as structured
	// content, which its SDK then checks against the output schema, so the
	// model got "Structured content does not match the tool's output
	// schema" instead of our message. The message comes first, as a model
	// reads it; the error object follows on the last line for programs.
	text := string(body.Code) + ": " + body.Message + "\n" + string(obj)
	return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(text)}, IsError: true}
}

// resultSize is the size of a result on the wire, near enough.
func resultSize(r *result) int {
	b, _ := json.Marshal(r.structured)
	t, _ := json.Marshal(r.text)
	return len(b) + len(t) + 128
}

// fit builds a result with build(limit), where limit caps the variable
// strings together, choosing the largest limit whose result fits the
// configured budget (JSON escaping makes the size hard to predict, so it
// searches).
func (s *srv) fit(build func(limit int) *result) *result {
	budget := s.opt.MaxResultBytes
	lo, hi := 256, budget
	r := build(hi)
	if resultSize(r) <= budget {
		return r
	}
	best := build(lo)
	for range 12 {
		if hi-lo <= 256 {
			break
		}
		mid := (lo + hi) / 2
		if m := build(mid); resultSize(m) <= budget {
			lo, best = mid, m
		} else {
			hi = mid
		}
	}
	return best
}

// cut shortens s to about limit bytes, keeping its head and its tail around
// a marker that says how much was cut and where the rest is. It reports
// whether it cut.
func cut(s string, limit int, where string) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	marker := func(n int) string {
		return fmt.Sprintf("\n[... %d bytes cut here; %s ...]\n", n, where)
	}
	room := limit - len(marker(len(s)))
	if room < 0 {
		room = 0
	}
	head := room / 3
	tail := room - head
	h := validPrefix(s[:head])
	t := validSuffix(s[len(s)-tail:])
	return h + marker(len(s)-len(h)-len(t)) + t, true
}

// split shares limit between two strings: each gets half, and what one
// does not need goes to the other.
func split(limit, a, b int) (int, int) {
	if a+b <= limit {
		return max(a, 1), max(b, 1)
	}
	half := limit / 2
	switch {
	case a < half:
		return a, limit - a
	case b < half:
		return limit - b, b
	}
	return half, limit - half
}

func validPrefix(s string) string {
	for i := 0; i < utf8.UTFMax && len(s) > 0 && !utf8.ValidString(s); i++ {
		s = s[:len(s)-1]
	}
	return s
}

func validSuffix(s string) string {
	for i := 0; i < utf8.UTFMax && len(s) > 0 && !utf8.RuneStart(s[0]); i++ {
		s = s[1:]
	}
	return s
}

// progressNotifier keeps a running call's client informed, on the
// request's own ordered stream (requestStream). With a progress token it
// sends the tool's output as progress notifications, coalesced to at most
// one every progressCoalesce and progressMaxMessage bytes each (older output
// of a burst is skipped with a marker), and, when the call stays silent for
// the heartbeat interval, a progress notification saying it still runs.
// Without a token it writes an SSE comment at that interval, so that
// clients waiting for the first byte of the answer with a deadline do not
// give up on a silent call. The progress value counts notifications, so it
// increases with each one as the protocol requires.
type progressNotifier struct {
	stream    *requestStream
	token     mcp.ProgressToken // nil: heartbeats only, as SSE comments
	heartbeat time.Duration
	started   time.Time

	mu       sync.Mutex
	pending  strings.Builder
	stream_  string // stream of the last pending bytes
	seq      int
	lastSent time.Time // of the last notification; loop goroutine only
	// sendRest: output still pending at stop is sent, not dropped (see
	// sendRestAtStop).
	sendRest bool
	wake     chan struct{}
	done     chan struct{}
	stopped  chan struct{}
}

const (
	progressCoalesce   = 50 * time.Millisecond
	progressMaxMessage = 8 << 10
	// progressSettle is the least time between a request's last progress
	// notification and its result. Being first on the wire is not enough:
	// the TypeScript SDK (and Claude Code, built on it) handles a
	// notification in a microtask but a response at once, so a
	// notification that reaches it in the same read as the result is
	// handled after it and fails with "unknown token" (issue 10, measured
	// in test/mcp TestProgressBeforeResult). A gap lets the client read
	// them apart.
	progressSettle = 50 * time.Millisecond
)

// newProgress returns the call's notifier, or nil when its answer cannot
// carry anything before the result.
func (c *call) newProgress(ctx context.Context) *progressNotifier {
	rs := streamFrom(ctx)
	if rs == nil || !rs.accepts {
		return nil
	}
	p := &progressNotifier{stream: rs, heartbeat: c.s.opt.ProgressInterval, started: time.Now(),
		wake: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	if meta := c.req.Params.Meta; meta != nil && meta.ProgressToken != nil {
		p.token = meta.ProgressToken
	}
	go p.loop()
	return p
}

// output is a sandbox.OutputFunc.
func (p *progressNotifier) output(stream string, data []byte) {
	if p.token == nil {
		return
	}
	p.mu.Lock()
	if stream != p.stream_ && stream == "stderr" {
		p.pending.WriteString("[stderr] ")
	}
	p.stream_ = stream
	p.pending.Write(data)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progressNotifier) loop() {
	defer close(p.stopped)
	beat := time.NewTimer(p.heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-p.wake:
			if p.flush() {
				beat.Reset(p.heartbeat)
			}
			select {
			case <-time.After(progressCoalesce):
			case <-p.done:
				p.settle()
				return
			}
		case <-beat.C:
			p.beat()
			beat.Reset(p.heartbeat)
		case <-p.done:
			p.settle()
			return
		}
	}
}

// sendRestAtStop makes stop send the output still pending: for a tool
// whose result does not carry that output (image_build's log).
func (p *progressNotifier) sendRestAtStop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.sendRest = true
	p.mu.Unlock()
}

// settle ends the notifier: output still pending is not sent (the result
// carries it) unless sendRestAtStop said so, and the result waits until
// progressSettle has passed since the last notification.
func (p *progressNotifier) settle() {
	p.mu.Lock()
	rest := p.sendRest
	p.mu.Unlock()
	if rest {
		p.flush()
	}
	if p.lastSent.IsZero() {
		return
	}
	if d := progressSettle - time.Since(p.lastSent); d > 0 {
		time.Sleep(d)
	}
}

// beat tells the client the call is still running.
func (p *progressNotifier) beat() {
	if p.token == nil {
		_ = p.stream.keepAlive()
		return
	}
	p.send(fmt.Sprintf("[still running after %s]\n", time.Since(p.started).Round(time.Second)))
}

// flush sends the pending output; it reports whether there was any.
func (p *progressNotifier) flush() bool {
	p.mu.Lock()
	msg := p.pending.String()
	p.pending.Reset()
	p.stream_ = ""
	p.mu.Unlock()
	if msg == "" {
		return false
	}
	if len(msg) > progressMaxMessage {
		keep := validSuffix(msg[len(msg)-progressMaxMessage:])
		msg = fmt.Sprintf("[... %d bytes not shown ...]\n", len(msg)-len(keep)) + keep
	}
	p.send(strings.ToValidUTF8(msg, "\uFFFD"))
	return true
}

func (p *progressNotifier) send(msg string) {
	p.seq++
	p.lastSent = time.Now()
	// An error means the client is gone or the answer already ended:
	// nothing to tell anyone.
	_ = p.stream.event(mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
		Method: string(mcp.MethodNotificationProgress),
		Params: mcp.NotificationParams{AdditionalFields: apitypes.ProgressMessage{
			ProgressToken: p.token, Progress: p.seq, Message: msg,
		}.Params()},
	}})
}

// stop ends the notifier and waits for it (see settle), so that every
// notification is written, and read apart, before the result.
func (p *progressNotifier) stop() {
	if p == nil {
		return
	}
	close(p.done)
	<-p.stopped
}

// outputFunc is the notifier's OutputFunc, or nil without a notifier.
func (p *progressNotifier) outputFunc() func(string, []byte) {
	if p == nil || p.token == nil {
		return nil
	}
	return p.output
}
