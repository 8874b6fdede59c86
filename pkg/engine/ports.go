package engine

import (
	"context"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
)

// The preview-port operations are the ports service's (pkg/services/ports);
// these methods keep the engine the one facade the front ends' narrow
// interfaces are satisfied by.

// ExposePortRequest asks for a sandbox's port to be served.
type ExposePortRequest = apitypes.ExposePortRequest

// PreviewPathPrefix is where the preview listener serves exposures.
const PreviewPathPrefix = ports.PreviewPathPrefix

// PreviewHostSuffix ends the host-name form of an exposure's address.
const PreviewHostSuffix = ports.PreviewHostSuffix

// SetPreviewURL records the address browsers reach the preview listener at.
func (e *Engine) SetPreviewURL(base string) { e.ports.SetPreviewURL(base) }

// ExposePort serves the sandbox's port on the preview listener.
func (e *Engine) ExposePort(ctx context.Context, req ExposePortRequest) (*apitypes.PortExposure, error) {
	return e.ports.Expose(ctx, req)
}

// Ports lists the sandbox's exposed ports, by port.
func (e *Engine) Ports(ctx context.Context, id string) ([]apitypes.PortExposure, error) {
	return e.ports.List(ctx, id)
}

// UnexposePort ends an exposure.
func (e *Engine) UnexposePort(ctx context.Context, id string, port int) error {
	return e.ports.Unexpose(ctx, id, port)
}

// AuthorizePreview checks a preview request's token.
func (e *Engine) AuthorizePreview(id string, port int, token string) error {
	return e.ports.Authorize(id, port, token)
}

// DialExposed opens a connection to an exposed port of a sandbox.
func (e *Engine) DialExposed(ctx context.Context, id string, port int) (net.Conn, error) {
	return e.ports.Dial(ctx, id, port)
}
