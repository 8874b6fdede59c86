package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// call is one tool invocation as the handlers see it.
type call struct {
	s       *srv
	req     mcp.CallToolRequest
	session string // MCP session id; "" when the protocol has none
}

// result is what a handler returns: the structured content and the readable
// text. Handlers that must fit variable-size output into the budget return
// a result built by fit.
type result struct {
	structured any
	text       string
}

// addTool registers tool name with typed input In and output Out. fn does
// the work; its errors become isError results carrying their taxonomy code.
func addTool[In, Out any](s *srv, name, title, description string, a annotations, fn func(ctx context.Context, c *call, in *In) (*result, error)) {
	opts := []mcp.ToolOption{mcp.WithDescription(description), mcp.WithInputSchema[In](), mcp.WithOutputSchema[Out]()}
	opts = append(opts, a.options(title)...)
	tool := mcp.NewTool(name, opts...)
	required := requiredOf(tool.RawInputSchema)
	s.mcp.AddTool(tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in In
		if err := decodeArgs(req.GetRawArguments(), required, &in); err != nil {
			return s.errorResult(name, err), nil
		}
		c := &call{s: s, req: req}
		if sess := server.ClientSessionFromContext(ctx); sess != nil {
			c.session = s.sessionID(sess.SessionID())
		}
		res, err := fn(ctx, c, &in)
		if err != nil {
			return s.errorResult(name, err), nil
		}
		return mcp.NewToolResultStructured(res.structured, res.text), nil
	})
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
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			field := typ.Field
			if field == "" {
				field = "arguments"
			}
			return errdefs.Invalidf("%s: want %s, got JSON %s", field, jsonType(typ.Type.Kind().String()), typ.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return errdefs.Invalidf("arguments: %s", strings.TrimPrefix(err.Error(), "json: "))
		case errors.Is(err, io.EOF):
			return nil
		}
		return errdefs.Invalidf("arguments: %v", err)
	}
	return nil
}

func jsonType(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "an integer"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "string":
		return "a string"
	case kind == "bool":
		return "a boolean"
	case kind == "slice", kind == "array":
		return "an array"
	case kind == "map", kind == "struct":
		return "an object"
	}
	return kind
}

// errorBody is docs/SPEC.md's error object.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorResult is the one place where errors become tool results. Internal
// errors are logged with their cause, which the client never sees.
func (s *srv) errorResult(tool string, err error) *mcp.CallToolResult {
	code := errdefs.CodeOf(err)
	if code == errdefs.Internal {
		s.log.Error("mcp tool failed", "tool", tool, "err", err)
	}
	body := map[string]errorBody{"error": {Code: string(code), Message: errdefs.MessageOf(err)}}
	text, _ := json.Marshal(body)
	// No structuredContent: clients validate it against the tool's output
	// schema even on errors (the TypeScript SDK does).
	return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(string(text))}, IsError: true}
}

// resultSize is the size of a result on the wire, near enough.
func resultSize(r *result) int {
	b, _ := json.Marshal(r.structured)
	t, _ := json.Marshal(r.text)
	return len(b) + len(t) + 128
}

// fit builds a result with build(limit), where limit caps each variable
// string, shrinking limit until the result fits the configured budget.
func (s *srv) fit(build func(limit int) *result) *result {
	budget := s.opt.MaxResultBytes
	limit := budget / 2
	var r *result
	for range 8 {
		r = build(limit)
		size := resultSize(r)
		if size <= budget || limit <= 256 {
			return r
		}
		limit = max(256, int(float64(limit)*float64(budget)/float64(size)*0.9))
	}
	return r
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

// incompleteTail is how many bytes at the end of b begin a UTF-8 sequence
// that b does not finish (0 when b ends on a rune boundary).
func incompleteTail(b string) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		c := b[len(b)-i]
		if utf8.RuneStart(c) {
			if c >= 0x80 && !utf8.FullRuneInString(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// progressNotifier sends a tool's output as progress notifications while it
// runs, when the client gave a progress token. Output is coalesced: at most
// one notification every progressInterval, each at most progressMaxMessage
// bytes (older output of a burst is skipped with a marker).
type progressNotifier struct {
	ctx   context.Context
	srv   *server.MCPServer
	token mcp.ProgressToken

	mu      sync.Mutex
	pending strings.Builder
	stream  string // stream of the last pending bytes
	skipped int
	total   int64
	wake    chan struct{}
	done    chan struct{}
	stopped chan struct{}
}

const (
	progressInterval   = 50 * time.Millisecond
	progressMaxMessage = 8 << 10
)

// newProgress returns a notifier, or nil when the request has no token.
func (c *call) newProgress(ctx context.Context) *progressNotifier {
	meta := c.req.Params.Meta
	if meta == nil || meta.ProgressToken == nil {
		return nil
	}
	srv := server.ServerFromContext(ctx)
	if srv == nil {
		return nil
	}
	p := &progressNotifier{ctx: ctx, srv: srv, token: meta.ProgressToken,
		wake: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go p.loop()
	return p
}

// output is a sandbox.OutputFunc.
func (p *progressNotifier) output(stream string, data []byte) {
	p.mu.Lock()
	if stream != p.stream && stream == "stderr" {
		p.pending.WriteString("[stderr] ")
	}
	p.stream = stream
	p.pending.Write(data)
	p.total += int64(len(data))
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progressNotifier) loop() {
	defer close(p.stopped)
	for {
		select {
		case <-p.wake:
			p.flush()
			select {
			case <-time.After(progressInterval):
			case <-p.done:
				p.flush()
				return
			}
		case <-p.done:
			p.flush()
			return
		}
	}
}

func (p *progressNotifier) flush() {
	p.mu.Lock()
	msg := p.pending.String()
	p.pending.Reset()
	p.stream = ""
	total := p.total
	p.mu.Unlock()
	if msg == "" {
		return
	}
	if len(msg) > progressMaxMessage {
		keep := validSuffix(msg[len(msg)-progressMaxMessage:])
		msg = fmt.Sprintf("[... %d bytes not shown ...]\n", len(msg)-len(keep)) + keep
	}
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	err := p.srv.SendNotificationToClient(p.ctx, string(mcp.MethodNotificationProgress), map[string]any{
		"progressToken": p.token, "progress": total, "message": msg,
	})
	if err != nil {
		p.mu.Lock()
		p.skipped++
		p.mu.Unlock()
	}
}

// stop sends what is pending and waits, so that every notification goes
// out before the result.
func (p *progressNotifier) stop() {
	if p == nil {
		return
	}
	close(p.done)
	<-p.stopped
}

// outputFunc is the notifier's OutputFunc, or nil without a notifier.
func (p *progressNotifier) outputFunc() func(string, []byte) {
	if p == nil {
		return nil
	}
	return p.output
}
