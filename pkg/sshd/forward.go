package sshd

import (
	"context"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// directTCPIP serves ssh -L: a connection to a port on the sandbox's own
// loopback, dialled by its agent. Only loopback destinations are taken:
// the forward is into the sandbox, not through it (its network policy
// decides where the sandbox itself may connect; a client that wants that
// runs its own tools inside).
func (c *conn) directTCPIP(nc ssh.NewChannel) {
	var dst struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &dst); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "mcp-sandboxd: malformed direct-tcpip request")
		return
	}
	switch dst.Host {
	case "localhost", "127.0.0.1", "::1", "ip6-localhost":
	default:
		c.log.Warn("ssh forward refused", "host", dst.Host, "port", dst.Port)
		_ = nc.Reject(ssh.Prohibited, "mcp-sandboxd: only the sandbox's own ports can be forwarded (use localhost:PORT)")
		return
	}
	if dst.Port < 1 || dst.Port > 65535 {
		_ = nc.Reject(ssh.ConnectionFailed, "mcp-sandboxd: port must be 1-65535")
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
	up, err := c.s.b.DialPort(ctx, c.login.sandboxID, int(dst.Port))
	cancel()
	if err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "mcp-sandboxd: "+errdefs.MessageOf(err))
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		_ = up.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	relay(ch, up, c.ctx)
}

// relay copies both ways until both directions end (half-closes passed
// on), or ctx ends.
func relay(ch ssh.Channel, up net.Conn, ctx context.Context) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = up.Close()
			_ = ch.Close()
		case <-done:
		}
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(up, ch)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = up.Close()
		}
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(ch, up)
		_ = ch.CloseWrite()
	}()
	wg.Wait()
	close(done)
	_ = up.Close()
	_ = ch.Close()
}
