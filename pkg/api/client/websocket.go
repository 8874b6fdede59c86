package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// maxMessage bounds one WebSocket message from the daemon (an output chunk
// or an event); the daemon's chunks are far smaller.
const maxMessage = 4 << 20

// dial opens a WebSocket to path. A refused upgrade comes back as the
// daemon's *errdefs.Error, like any other failed request.
func (c *Client) dial(ctx context.Context, path string, q url.Values) (*websocket.Conn, error) {
	u := c.url(path, q)
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return nil, decodeError(resp)
		}
		return nil, transportError(err)
	}
	conn.SetReadLimit(maxMessage)
	return conn, nil
}

// Terminal is an interactive command on a pseudo-terminal in a sandbox,
// attached over a WebSocket.
type Terminal struct {
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	out    chan []byte
	done   chan struct{}

	// Set by the reader before done is closed.
	exit *TerminalMessage
	err  error

	writeMu sync.Mutex
}

// OpenTerminal starts req on a new pseudo-terminal in sandbox id. The
// terminal lives until the command exits or Close is called.
func (c *Client) OpenTerminal(ctx context.Context, id string, req TerminalRequest) (*Terminal, error) {
	q := url.Values{}
	if req.Command != "" {
		q.Set("cmd", req.Command)
	}
	for _, a := range req.Argv {
		q.Add("argv", a)
	}
	for k, v := range req.Env {
		q.Add("env", k+"="+v)
	}
	if req.Cwd != "" {
		q.Set("cwd", req.Cwd)
	}
	if req.Rows != 0 {
		q.Set("rows", strconv.Itoa(int(req.Rows)))
	}
	if req.Cols != 0 {
		q.Set("cols", strconv.Itoa(int(req.Cols)))
	}
	conn, err := c.dial(ctx, sandboxPath(id, "/terminal"), q)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &Terminal{conn: conn, ctx: tctx, cancel: cancel, out: make(chan []byte, 16), done: make(chan struct{})}
	go t.read()
	return t, nil
}

// read delivers output until the daemon's exit message and close.
func (t *Terminal) read() {
	defer close(t.done)
	defer close(t.out)
	for {
		typ, data, err := t.conn.Read(t.ctx)
		if err != nil {
			if t.exit == nil {
				t.err = fmt.Errorf("terminal connection: %w", err)
			}
			return
		}
		if typ == websocket.MessageBinary {
			select {
			case t.out <- data:
			case <-t.ctx.Done():
				return
			}
			continue
		}
		var m TerminalMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.err = fmt.Errorf("terminal: bad control message: %w", err)
			return
		}
		if m.Type == TerminalExit {
			t.exit = &m
		}
	}
}

// Output delivers what the terminal prints. It is closed when the command
// has ended (or the connection is lost); the caller must drain it.
func (t *Terminal) Output() <-chan []byte { return t.out }

// Write sends keyboard input.
func (t *Terminal) Write(p []byte) (int, error) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, fmt.Errorf("terminal input: %w", err)
	}
	return len(p), nil
}

// Resize changes the terminal's size.
func (t *Terminal) Resize(rows, cols uint16) error {
	b, err := json.Marshal(TerminalMessage{Type: TerminalResize, Rows: rows, Cols: cols})
	if err != nil {
		return fmt.Errorf("encode resize: %w", err)
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.conn.Write(t.ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("terminal resize: %w", err)
	}
	return nil
}

// Wait blocks until the command has ended and returns its exit code and
// termination (the output went through Output, which must be drained).
func (t *Terminal) Wait() (*ExecResult, error) {
	<-t.done
	switch {
	case t.exit == nil && t.err != nil:
		return nil, t.err
	case t.exit == nil:
		return nil, errors.New("terminal closed before the command ended")
	case t.exit.Error != nil:
		return nil, t.exit.Error.Err()
	}
	res := &ExecResult{ExitCode: -1}
	if t.exit.ExitCode != nil {
		res.ExitCode = *t.exit.ExitCode
	}
	if t.exit.Termination != nil {
		res.Termination = *t.exit.Termination
	}
	return res, nil
}

// Close detaches from the terminal; the daemon kills a command that is
// still running.
func (t *Terminal) Close() error {
	err := t.conn.Close(websocket.StatusNormalClosure, "")
	t.cancel()
	<-t.done
	if err != nil && !errors.Is(err, net.ErrClosed) { // already closed by the daemon: fine
		return fmt.Errorf("close terminal: %w", err)
	}
	return nil
}

// Events calls fn with every event about sandbox id ("" for all sandboxes)
// until ctx ends, fn returns an error, or the daemon goes away. A context
// ending is not an error.
func (c *Client) Events(ctx context.Context, id string, fn func(Event) error) error {
	q := url.Values{}
	if id != "" {
		q.Set("sandbox_id", id)
	}
	conn, err := c.dial(ctx, "/v1/events", q)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("event stream: %w", err)
		}
		var ev Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("event stream: bad event: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
