// Package vport carries the sandbox-agent protocol, which uses one
// connection per request, over a VM's single virtio-serial channel: the
// channel holds one yamux session, and every agent connection is a yamux
// stream. The guest side (Listen, in sandbox-agent) accepts streams; the
// host side (Session, in the daemon) opens them. vsock would give
// connections natively but needs vhost-vsock on the host, which the
// project's build machine lacks; virtio-serial works under TCG everywhere.
//
// A virtio-serial port survives the host side disconnecting (the daemon
// restarting) and the guest being restored from a snapshot, but a yamux
// session does not: either side then sees protocol errors or EOF. Both
// sides therefore treat a broken session as normal: the guest reopens the
// port and starts a new session, the host dials the chardev again.
//
// Security boundary: this package only frames bytes; the agent protocol
// above it validates everything (the guest is untrusted, see pkg/agent).
// Sessions keep alive with pings so that a silent peer is detected.
package vport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// AgentPortName is the virtio-serial port name of the agent channel; the
// guest finds it at /dev/virtio-ports/<name>.
const AgentPortName = "org.sandboxrunner.agent.0"

// config is the yamux configuration of both sides.
func config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 10 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}

// listener is the guest side: a net.Listener over sessions on the port.
type listener struct {
	path   string
	open   func() (io.ReadWriteCloser, error)
	log    *slog.Logger
	conns  chan net.Conn
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	closer io.Closer
}

// Listen serves yamux sessions on the virtio-serial port at path (for
// example /dev/virtio-ports/org.sandboxrunner.agent.0) and returns a
// listener of the streams the host opens.
func Listen(path string, log *slog.Logger) (net.Listener, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("virtio port: %w", err)
	}
	open := func() (io.ReadWriteCloser, error) { return os.OpenFile(path, os.O_RDWR, 0) }
	return listen(path, open, log), nil
}

func listen(path string, open func() (io.ReadWriteCloser, error), log *slog.Logger) *listener {
	l := &listener{path: path, open: open, log: log, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *listener) run() {
	for {
		select {
		case <-l.done:
			return
		default:
		}
		if err := l.session(); err != nil {
			l.log.Debug("agent channel session ended", "err", err)
		}
		// The port reads EOF while the host side is not connected: wait
		// before the next try instead of spinning.
		select {
		case <-l.done:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// session serves one yamux session until it breaks.
func (l *listener) session() error {
	f, err := l.open()
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.closer = f
	l.mu.Unlock()
	defer f.Close()
	s, err := yamux.Server(f, config())
	if err != nil {
		return err
	}
	defer s.Close()
	if err := announce(s); err != nil {
		return err
	}
	for {
		c, err := s.Accept()
		if err != nil {
			return err
		}
		select {
		case l.conns <- c:
		case <-l.done:
			c.Close()
			return net.ErrClosed
		}
	}
}

// readyLine is what the guest's side of a new session sends on a stream
// it opens itself, first thing. The host uses a session only after reading
// it: bytes the host sends earlier might reach the guest's previous session
// (the disconnect and the new data travel on different virtqueues, so the
// guest may see the data first), which would break both.
const readyLine = "vport ready\n"

func announce(s *yamux.Session) error {
	st, err := s.OpenStream()
	if err != nil {
		return err
	}
	defer st.Close()
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(st, readyLine)
	return err
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		if l.closer != nil {
			l.closer.Close()
		}
		l.mu.Unlock()
	})
	return nil
}

func (l *listener) Addr() net.Addr { return addr(l.path) }

type addr string

func (a addr) Network() string { return "virtio-serial" }
func (a addr) String() string  { return string(a) }

// Session is the host side: it dials QEMU's unix socket of the agent
// channel and opens a stream per agent connection, redialling when the
// session broke.
type Session struct {
	path string
	dial func(ctx context.Context) (net.Conn, error)
	mu   sync.Mutex
	s    *yamux.Session
}

// NewSession returns the host side for the chardev socket at path. It
// dials on first use.
func NewSession(path string) *Session {
	return &Session{path: path, dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
}

// Dial opens a new agent connection. A session that fails to open a
// stream is dropped and one new session is tried.
func (h *Session) Dial(ctx context.Context) (net.Conn, error) {
	var lastErr error
	for range 2 {
		s, err := h.session(ctx)
		if err != nil {
			return nil, err
		}
		c, err := openStream(ctx, s)
		if err == nil {
			return c, nil
		}
		lastErr = err
		h.drop(s)
	}
	return nil, fmt.Errorf("agent channel %s: %w", h.path, lastErr)
}

func openStream(ctx context.Context, s *yamux.Session) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := s.OpenStream()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func (h *Session) session(ctx context.Context) (*yamux.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.s != nil && !h.s.IsClosed() {
		return h.s, nil
	}
	// A new session is usable once the guest's side announced itself;
	// the guest may still be on its previous session (it reopens the port
	// every 200 ms after an EOF), or its announcement may have been dropped
	// while no host was connected: then hang up and try again.
	for {
		s, err := h.newSession(ctx)
		if err == nil {
			h.s = s
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent channel: %w (%w)", ctx.Err(), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readyTimeout is how long a new session waits for the guest's
// announcement before hanging up.
const readyTimeout = 2 * time.Second

func (h *Session) newSession(ctx context.Context) (*yamux.Session, error) {
	nc, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	s, err := yamux.Client(nc, config())
	if err != nil {
		nc.Close()
		return nil, err
	}
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := s.AcceptStream()
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer st.Close()
		_ = st.SetReadDeadline(time.Now().Add(readyTimeout))
		buf := make([]byte, len(readyLine))
		_, err = io.ReadFull(st, buf)
		ch <- res{string(buf), err}
	}()
	t := time.NewTimer(readyTimeout)
	defer t.Stop()
	var r res
	select {
	case r = <-ch:
	case <-t.C:
		r.err = errors.New("guest side did not announce the session")
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	if r.err == nil && r.line != readyLine {
		r.err = fmt.Errorf("unexpected announcement %q", r.line)
	}
	if r.err != nil {
		s.Close()
		return nil, r.err
	}
	return s, nil
}

func (h *Session) drop(s *yamux.Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.Close()
	if h.s == s {
		h.s = nil
	}
}

// Reset drops the session (after a snapshot restore the guest's side of it
// is from the past).
func (h *Session) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.s != nil {
		h.s.Close()
		h.s = nil
	}
}

// Close drops the session.
func (h *Session) Close() error {
	h.Reset()
	return nil
}
