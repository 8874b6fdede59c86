package main

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/preview"
)

// listenPreview opens the preview listener (server.preview_listen) and
// gives the engine its address, which exposures' URLs are built on. It
// returns a nil listener when none is configured; the caller serves the
// handler on it and closes the handler when done.
func listenPreview(cfg *config.Config, eng *engine.Engine, log *slog.Logger) (net.Listener, *preview.Handler, error) {
	if cfg.Server.PreviewListen == "" {
		return nil, nil, nil
	}
	l, err := net.Listen("tcp", cfg.Server.PreviewListen)
	if err != nil {
		return nil, nil, fmt.Errorf("server.preview_listen: %w", err)
	}
	eng.SetPreviewURL(preview.BaseURL(l.Addr()))
	return l, preview.NewHandler(eng, log), nil
}
