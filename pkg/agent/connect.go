package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// ValidatePort checks that port is a TCP port number (1-65535).
func ValidatePort(port int) error {
	if port < 1 || port > 65535 {
		return Errorf(errdefs.InvalidArgument, "port: %d is not in 1-65535", port)
	}
	return nil
}

// DialPort opens a TCP connection to port on the loopback of the sandbox's
// network namespace, relayed by the agent over one agent connection: after
// the agent's result frame the connection carries the TCP stream's bytes
// both ways. It works whatever the sandbox's network mode (none included)
// and whatever the agent's transport, because the agent is the one that
// dials. ctx bounds only the opening; the returned connection lasts until
// it is closed or either side ends.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := ValidatePort(port); err != nil {
		return nil, err
	}
	cn, err := c.do(ctx, &Request{Op: OpConnect, Port: port}, nil)
	if err != nil {
		return nil, err
	}
	if _, err := cn.expect(FrameResult, 0); err != nil {
		cn.close()
		return nil, err
	}
	// From here on the stream is the application's: no request deadline,
	// no cancellation by the dial's context.
	cn.stop()
	if err := cn.nc.SetDeadline(time.Time{}); err != nil {
		_ = cn.nc.Close()
		return nil, fmt.Errorf("agent: %w", err)
	}
	return &portConn{Conn: cn.nc, r: cn.r}, nil
}

// portConn is a relayed TCP stream. Reads go through the buffered reader
// the result frame was read with, which may already hold the first bytes
// of the stream.
type portConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *portConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// CloseWrite half-closes the stream when the transport can (a unix
// socket): the agent then half-closes the TCP connection inside.
func (p *portConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
