package mcpserver

import (
	"context"
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

type exposePortIn struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of the sandbox, as sandbox_create returned it (sb-...)."`
	Port      int    `json:"port" jsonschema_description:"TCP port a server in the sandbox listens on (1-65535), on any address including 127.0.0.1."`
}

func (s *srv) addPortTools() {
	addTool[exposePortIn, apitypes.PortExposure](s, "sandbox_expose_port", "Expose a sandbox port for preview",
		"Serve a TCP port of a sandbox (a web app, a dev server, a WebSocket) on the daemon's preview listener and return its URL, which a browser opens directly (it carries the exposure's own token once; programs send token in the token_header header instead). Works in every network mode, none included. Nothing needs to listen yet; requests fail with 502 until something does. Exposing an exposed port returns the same URL. Exposures end with the sandbox.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *exposePortIn) (*result, error) {
			x, err := s.e.ExposePort(ctx, apitypes.ExposePortRequest{SandboxID: in.SandboxID, Port: in.Port})
			if err != nil {
				return nil, err
			}
			return &result{structured: x, text: fmt.Sprintf("port %d of sandbox %s is served at %s\n", x.Port, x.SandboxID, x.URL)}, nil
		})
}
