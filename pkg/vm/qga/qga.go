// Package qga is a client of the QEMU guest agent protocol (qemu-ga on
// Linux and Windows guests): guest-sync-delimited resynchronisation,
// guest-ping, guest-exec polled through guest-exec-status, chunked
// guest-file-* transfers and guest-shutdown.
//
// The wire format is QMP-like JSON, one object per line, over a byte stream
// that survives the agent restarting or the guest being restored from a
// snapshot. After such events stale replies or a half-parsed request may sit
// in the stream, so before the first call and after any failed call the
// client resynchronises: it sends 0xFF (which makes qemu-ga drop whatever it
// has parsed so far) and guest-sync-delimited with a random id, then
// discards everything up to a 0xFF byte in the reply stream and accepts
// only the reply carrying its id.
//
// Security boundary: everything the guest says is untrusted. Replies are
// read with a line limit, every call has a deadline (taken from the
// context, or DefaultTimeout), exec output is capped by what qemu-ga
// retains, and file reads stop at the caller's limit.
package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// maxLine bounds one reply line. The largest legitimate reply is a
// guest-file-read of ReadChunk bytes (base64: 4/3 of it) or
// guest-exec-status carrying the output qemu-ga retains (16 MiB per stream
// in qemu-ga 7.2, base64-encoded, both streams).
const maxLine = 48 << 20

// ReadChunk and WriteChunk are the sizes of one guest-file-read and one
// guest-file-write. qemu-ga caps a read at 48 MB; a write is one JSON
// request, which qemu-ga's parser accepts up to 64 MiB.
const (
	ReadChunk  = 1 << 20
	WriteChunk = 1 << 20
)

// Error is an error reply of the agent ({"error":{"class","desc"}}).
type Error struct {
	Command string
	Class   string
	Desc    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("qga %s: %s (%s)", e.Command, e.Desc, e.Class)
}

// Client talks to one guest agent over one stream. It is safe for
// concurrent use; calls are serialised because replies carry no id.
type Client struct {
	mu     sync.Mutex
	conn   net.Conn
	r      *bufio.Reader
	synced bool
	closed bool
}

// New returns a client on conn (a unix socket of QEMU's chardev, or any
// stream). It takes ownership of conn.
func New(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
}

// Dial connects to the unix socket path of a guest agent chardev.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "guest agent socket")
	}
	return New(conn), nil
}

// Close closes the connection; pending and later calls fail.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	// Closing without the lock unblocks a call stuck in a read.
	return c.conn.Close()
}

// deadline returns ctx's deadline or now+DefaultTimeout.
func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(DefaultTimeout)
}

// Sync resynchronises the stream (see the package comment). Calls do it
// themselves when needed; Sync is exported to probe readiness.
func (c *Client) Sync(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced = false
	return c.syncLocked(ctx)
}

func (c *Client) syncLocked(ctx context.Context) error {
	if c.closed {
		return errdefs.Unavailablef("qga: client closed")
	}
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Now()) })
	defer stop()
	_ = c.conn.SetDeadline(deadline(ctx))
	id := rand.Int64N(1<<53) + 1 // exact in JSON numbers read as float by some agents
	req := fmt.Sprintf("\xff{\"execute\":\"guest-sync-delimited\",\"arguments\":{\"id\":%d}}\n", id)
	if _, err := io.WriteString(c.conn, req); err != nil {
		return c.ioError(ctx, "guest-sync-delimited", err)
	}
	for {
		// Everything before the delimiter is a stale reply or noise.
		if _, err := c.r.ReadBytes(0xFF); err != nil {
			return c.ioError(ctx, "guest-sync-delimited", err)
		}
		line, err := c.readLine()
		if err != nil {
			return c.ioError(ctx, "guest-sync-delimited", err)
		}
		var rep struct {
			Return *int64 `json:"return"`
		}
		if json.Unmarshal(line, &rep) == nil && rep.Return != nil && *rep.Return == id {
			c.synced = true
			return nil
		}
	}
}

// readLine reads one line of at most maxLine bytes.
func (c *Client) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := c.r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > maxLine {
			return nil, fmt.Errorf("reply line longer than %d bytes", maxLine)
		}
		if err == nil {
			return bytes.TrimSpace(buf), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) && len(buf) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// ioError turns a transport failure into a clear error; the stream must be
// resynchronised before the next call.
func (c *Client) ioError(ctx context.Context, cmd string, err error) error {
	c.synced = false
	switch {
	case ctx.Err() != nil:
		return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "qga %s: no reply", cmd)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return errdefs.Wrap(errdefs.Unavailable, err, "qga %s: connection to the guest agent closed", cmd)
	case isTimeout(err):
		return errdefs.Wrap(errdefs.Unavailable, err, "qga %s: guest agent did not answer in time", cmd)
	default:
		return errdefs.Wrap(errdefs.Unavailable, err, "qga %s", cmd)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Call runs one command and decodes its "return" into out (nil: ignored).
func (c *Client) Call(ctx context.Context, cmd string, args, out any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callLocked(ctx, cmd, args, out)
}

func (c *Client) callLocked(ctx context.Context, cmd string, args, out any) error {
	if !c.synced {
		if err := c.syncLocked(ctx); err != nil {
			return err
		}
	}
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{cmd, args}
	b, err := json.Marshal(req)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "qga %s: encode", cmd)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Now()) })
	defer stop()
	_ = c.conn.SetDeadline(deadline(ctx))
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return c.ioError(ctx, cmd, err)
	}
	for {
		line, err := c.readLine()
		if err != nil {
			return c.ioError(ctx, cmd, err)
		}
		// A stray delimiter byte (a late sync reply) may precede JSON.
		line = bytes.TrimLeft(line, "\xff")
		if len(line) == 0 {
			continue
		}
		var rep struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &rep); err != nil {
			c.synced = false
			return errdefs.Wrap(errdefs.Unavailable, err, "qga %s: malformed reply %.80q", cmd, line)
		}
		switch {
		case rep.Error != nil:
			return &Error{Command: cmd, Class: rep.Error.Class, Desc: rep.Error.Desc}
		case rep.Return == nil:
			c.synced = false
			return errdefs.Unavailablef("qga %s: reply without return or error: %.80q", cmd, line)
		case out == nil:
			return nil
		default:
			if err := json.Unmarshal(rep.Return, out); err != nil {
				return errdefs.Wrap(errdefs.Unavailable, err, "qga %s: unexpected reply %.80q", cmd, rep.Return)
			}
			return nil
		}
	}
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.Call(ctx, "guest-ping", nil, nil)
}

// Info is the part of guest-info the backend uses.
type Info struct {
	Version  string `json:"version"`
	Commands []struct {
		Name    string `json:"name"`
		Enabled bool   `json:"enabled"`
	} `json:"supported_commands"`
}

// Info returns the agent's version and commands.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var in Info
	if err := c.Call(ctx, "guest-info", nil, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

// Shutdown asks the guest to power down (mode "powerdown", "halt" or
// "reboot"). qemu-ga sends no reply when it succeeds, so a closed
// connection or no answer within a short wait counts as success; an error
// reply does not.
func (c *Client) Shutdown(ctx context.Context, mode string) error {
	switch mode {
	case "powerdown", "halt", "reboot":
	default:
		return errdefs.Invalidf("mode: %q is not powerdown, halt or reboot", mode)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := c.Call(ctx, "guest-shutdown", map[string]string{"mode": mode}, nil)
	var qe *Error
	if errors.As(err, &qe) {
		return err
	}
	return nil
}

// b64 decodes base64 from the agent; an absent field is empty.
func b64(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	return base64.StdEncoding.DecodeString(s)
}
