package sandbox

import (
	"context"
	"errors"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// DialPort opens a TCP connection to port on sandbox id's loopback,
// relayed by its agent (agent.Client.DialPort), so that it works in every
// network mode and through every backend's agent transport. Opening one
// counts as activity against the idle timeout.
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	sb, _, err := m.live(ctx, id, CapPorts)
	if err != nil {
		return nil, err
	}
	m.touch(sb)
	c, err := sb.agent.DialPort(ctx, port)
	if err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && ae.Code == errdefs.Unavailable {
			// Nothing listens on the port (yet): the caller may retry.
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "%s", ae.Message)
		}
		return nil, m.agentError(sb, err, "connect to port")
	}
	return c, nil
}
