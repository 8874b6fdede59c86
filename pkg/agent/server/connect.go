package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// connectTimeout bounds opening the TCP connection inside the sandbox.
const connectTimeout = 5 * time.Second

// connect serves OpConnect: it opens a TCP connection to the requested port
// on the sandbox's loopback and relays bytes between it and the agent
// connection until both directions have ended.
//
// Security boundary: the agent dials only loopback addresses of its own
// network namespace, never an address the request names, so a preview
// exposure cannot be turned into a relay to other hosts (or, in egress
// mode, around the sandbox's firewall). What the daemon lets reach this op
// (exposed ports only, behind a token) is decided in pkg/services/ports.
func (s *Server) connect(req *agent.Request, c net.Conn, r *bufio.Reader, rp *reply) error {
	if err := agent.ValidatePort(req.Port); err != nil {
		return err
	}
	tcp, err := dialLoopback(req.Port)
	if err != nil {
		return agent.Errorf(errdefs.Unavailable, "port: nothing accepts connections on port %d in the sandbox: %v", req.Port, err)
	}
	defer tcp.Close()
	if err := rp.send(&agent.Frame{Type: agent.FrameResult}); err != nil {
		return fmt.Errorf("%w: send connect result: %w", errAbort, err)
	}
	// The stream lasts as long as its two ends want it to.
	_ = c.SetDeadline(time.Time{})
	relay(c, r, tcp)
	return nil
}

// dialLoopback connects to port on 127.0.0.1, or on ::1 if nothing listens
// on the IPv4 loopback (a server bound to ::1 only).
func dialLoopback(port int) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: connectTimeout}
	p := strconv.Itoa(port)
	nc, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.1", p))
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		if nc6, err6 := d.Dial("tcp6", net.JoinHostPort("::1", p)); err6 == nil {
			nc, err = nc6, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return nc.(*net.TCPConn), nil
}

// relay copies both ways between the agent connection (read through r,
// which may hold buffered bytes) and the TCP connection. A clean end of one
// direction is passed on as a half-close; an error in either ends both.
func relay(c net.Conn, r *bufio.Reader, tcp *net.TCPConn) {
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(tcp, r)
		if err == nil {
			err = tcp.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(c, tcp)
		if err == nil {
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			} else {
				err = io.EOF // no half-close on this transport: end the stream
			}
		}
		errc <- err
	}()
	for range 2 {
		if err := <-errc; err != nil {
			// Unblock the other direction.
			_ = tcp.Close()
			_ = c.Close()
		}
	}
}
