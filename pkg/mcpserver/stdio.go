package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// ServeStdio serves one MCP client on in and out (newline-delimited
// JSON-RPC) with the engine in this process, until in ends or ctx is done.
// It runs the same streamable-HTTP handler the daemon serves, on an
// in-memory connection, behind the same Bridge: one code path for every
// transport, so every protocol revision and the ordering of a request's
// notifications before its result hold alike. Nothing but protocol
// messages is written to out. When it returns the session has ended (see
// Options.OnSessionEnd).
func ServeStdio(ctx context.Context, e Engine, opt Options, in io.Reader, out io.Writer) error {
	h := NewHandler(e, opt)
	l := newPipeListener()
	hs := &http.Server{Handler: h, ErrorLog: log.New(slogWriter{opt.Log}, "", 0), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(l) }()
	err := Bridge(ctx, l.dial, in, out, opt.Log)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	<-served
	return err
}

// pipeListener is a net.Listener whose connections are in-memory pipes.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.closed) }); return nil }

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }

// Refuse answers every request read from in with a JSON-RPC error carrying
// why, until in ends: for `mcp-sandboxd stdio` when it can serve nothing
// (no daemon and no root), so that the client shows the reason rather
// than a dead server whose stderr nobody reads.
func Refuse(ctx context.Context, in io.Reader, out io.Writer, why string) error {
	r := bufio.NewReaderSize(in, 1<<20)
	for ctx.Err() == nil {
		line, err := r.ReadBytes('\n')
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &m) == nil && m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" {
			msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": m.ID,
				"error": map[string]any{"code": refusedCode, "message": why}})
			if _, werr := out.Write(append(msg, '\n')); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

// refusedCode is the JSON-RPC error code of Refuse: the implementation-
// defined server error range.
const refusedCode = -32000

type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("mcp stdio", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

// Bridge carries an MCP client's stdio session to a streamable-HTTP MCP
// endpoint reached through dial (the daemon's unix socket): every JSON-RPC
// message read from in is POSTed to /mcp, and every message the server
// answers — JSON bodies, SSE events of a POST, and the GET stream of
// server-initiated messages — is written to out, one per line. The session
// id and protocol version the server hands out are carried on every
// request. When in ends (or ctx is done) the session is deleted on the
// server, so that it ends there too.
func Bridge(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), in io.Reader, out io.Writer, log *slog.Logger) error {
	return BridgeTo(ctx, bridgeURL, &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 16,
	}, in, out, log)
}

// BridgeTo is Bridge to the MCP endpoint at url (a daemon's or a
// gateway's /mcp over TCP) through rt, which adds the caller's
// credentials.
func BridgeTo(ctx context.Context, url string, rt http.RoundTripper, in io.Reader, out io.Writer, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	b := &bridge{out: out, log: log, url: url, client: &http.Client{Transport: rt}}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var posts, listener sync.WaitGroup
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		r := bufio.NewReaderSize(in, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				select {
				case lines <- line:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readErr <- err
				return
			}
		}
	}()
	var err error
loop:
	for {
		select {
		case line := <-lines:
			msg := json.RawMessage(bytes.TrimSpace(line))
			if !json.Valid(msg) {
				b.write(json.RawMessage(`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`))
				continue
			}
			// An initialize must finish before anything else is sent, so
			// that later messages carry the session id it creates.
			if isInitialize(msg) {
				b.post(ctx, msg)
				listener.Add(1)
				go func() { defer listener.Done(); b.listen(ctx) }()
				continue
			}
			posts.Add(1)
			go func() { defer posts.Done(); b.post(ctx, msg) }()
		case err = <-readErr:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	// At the end of the input, answer what was asked; when ctx ends (a
	// signal), stop at once. Then end the session.
	posts.Wait()
	cancel()
	listener.Wait()
	b.deleteSession()
	return err
}

type bridge struct {
	client *http.Client
	url    string // the endpoint
	log    *slog.Logger

	outMu sync.Mutex
	out   io.Writer

	mu        sync.Mutex
	sessionID string
	version   string
}

// bridgeURL is the endpoint on the daemon's unix socket (the host is
// never resolved: every connection is dialled to the socket).
const bridgeURL = "http://localhost/mcp"

func isInitialize(msg json.RawMessage) bool {
	var m struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(msg, &m)
	return m.Method == string(mcp.MethodInitialize)
}

// write sends one message to the client.
func (b *bridge) write(msg json.RawMessage) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, msg); err != nil {
		b.log.Warn("mcp bridge: server sent invalid JSON", "err", err)
		return
	}
	buf.WriteByte('\n')
	b.outMu.Lock()
	defer b.outMu.Unlock()
	if _, err := b.out.Write(buf.Bytes()); err != nil {
		b.log.Warn("mcp bridge: write to client", "err", err)
	}
}

func (b *bridge) headers(h http.Header, msg json.RawMessage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessionID != "" {
		h.Set(mcp.HeaderSessionID, b.sessionID)
	}
	v := b.version
	if msg != nil {
		// A request that names its protocol version (2026-07-28 and later
		// carry it in _meta) is sent with that version.
		var m struct {
			Params struct {
				Meta map[string]any `json:"_meta"`
			} `json:"params"`
		}
		if json.Unmarshal(msg, &m) == nil {
			if pv, ok := m.Params.Meta[mcp.MetaKeyProtocolVersion].(string); ok && pv != "" {
				v = pv
			}
		}
	}
	if v != "" {
		h.Set(mcp.HeaderProtocolVersion, v)
	}
	if msg == nil {
		return
	}
	// From 2026-07-28 on, a POST names its method and (tools/call,
	// resources/read, prompts/get) its target in headers as well, and the
	// server rejects a request without them (SEP-2243). Older revisions
	// ignore them.
	var m struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(msg, &m) != nil || m.Method == "" {
		return
	}
	h.Set(mcp.HeaderMethod, m.Method)
	if name, ok := headerName(m.Method, m.Params); ok {
		if enc, ok := mcp.EncodeHeaderValue(name); ok {
			h.Set(mcp.HeaderName, enc)
		}
	}
}

// headerName is the Mcp-Name of a request: mcp-go's for tools/call,
// resources/read and prompts/get, and params.taskId for the tasks
// extension's tasks/get, tasks/update and tasks/cancel (which the
// extension requires for routing; mcp-go v1.2.1 does not know them).
func headerName(method string, params json.RawMessage) (string, bool) {
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel":
		var p struct {
			TaskID string `json:"taskId"`
		}
		if json.Unmarshal(params, &p) == nil && p.TaskID != "" {
			return p.TaskID, true
		}
		return "", false
	}
	return mcp.ExtractHeaderName(mcp.MCPMethod(method), params)
}

// post sends one message and relays the answer.
func (b *bridge) post(ctx context.Context, msg json.RawMessage) {
	var head struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	_ = json.Unmarshal(msg, &head)
	isRequest := head.Method != "" && len(head.ID) > 0 && string(head.ID) != "null"
	fail := func(format string, args ...any) {
		text := fmt.Sprintf(format, args...)
		b.log.Warn("mcp bridge", "method", head.Method, "err", text)
		if isRequest {
			e, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": head.ID,
				"error": map[string]any{"code": -32603, "message": "mcp-sandboxd daemon: " + text}})
			b.write(e)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(msg))
	if err != nil {
		fail("%v", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	b.headers(req.Header, msg)
	res, err := b.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			fail("%v", err)
		}
		return
	}
	defer res.Body.Close()
	if head.Method == string(mcp.MethodInitialize) {
		if id := res.Header.Get(mcp.HeaderSessionID); id != "" {
			b.mu.Lock()
			b.sessionID = id
			b.mu.Unlock()
		}
	}
	if res.StatusCode == http.StatusAccepted || res.StatusCode == http.StatusNoContent {
		return
	}
	ct := res.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "text/event-stream"):
		b.relaySSE(res.Body, head.Method == string(mcp.MethodInitialize))
	case strings.HasPrefix(ct, "application/json"):
		body, err := io.ReadAll(io.LimitReader(res.Body, 256<<20))
		if err != nil {
			fail("read answer: %v", err)
			return
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return
		}
		if head.Method == string(mcp.MethodInitialize) {
			b.noteVersion(body)
		}
		b.write(body)
	default:
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		fail("HTTP %d: %s", res.StatusCode, strings.TrimSpace(string(body)))
	}
}

// noteVersion remembers the protocol version an initialize result agreed.
func (b *bridge) noteVersion(body []byte) {
	var r struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(body, &r) == nil && r.Result.ProtocolVersion != "" {
		b.mu.Lock()
		b.version = r.Result.ProtocolVersion
		b.mu.Unlock()
	}
}

// relaySSE writes every event's data to the client.
func (b *bridge) relaySSE(r io.Reader, initialize bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	var data []string
	flush := func() {
		if len(data) == 0 {
			return
		}
		msg := []byte(strings.Join(data, "\n"))
		data = data[:0]
		if initialize {
			b.noteVersion(msg)
		}
		b.write(msg)
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	flush()
}

// listen holds the GET stream that carries server-initiated messages, and
// reopens it while the session lasts. Servers without one answer 405.
func (b *bridge) listen(ctx context.Context) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		b.headers(req.Header, nil)
		if req.Header.Get(mcp.HeaderSessionID) == "" {
			return // a stateless server has nothing to push
		}
		res, err := b.client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Debug("mcp bridge: GET stream", "err", err)
			}
		} else {
			ok := res.StatusCode == http.StatusOK && strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
			if ok {
				b.relaySSE(res.Body, false)
			}
			res.Body.Close()
			if !ok {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// deleteSession ends the session on the server.
func (b *bridge) deleteSession() {
	b.mu.Lock()
	id := b.sessionID
	b.mu.Unlock()
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, b.url, nil)
	if err != nil {
		return
	}
	b.headers(req.Header, nil)
	res, err := b.client.Do(req)
	if err != nil {
		b.log.Warn("mcp bridge: end session", "err", err)
		return
	}
	res.Body.Close()
}
