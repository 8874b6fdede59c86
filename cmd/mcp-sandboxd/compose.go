package main

import (
	"context"
	"log/slog"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services"
)

// compose is the daemon's composition root: the engine's core (stores,
// backends, network, the sandbox service), the services over it
// (services.Compose, the one place a service is made), then the start of
// their background work. serve and stdio share it; the front ends are
// then made over the engine by their commands. The caller holds the state
// directory's lock.
func compose(ctx context.Context, cfg *config.Config, log *slog.Logger) (*engine.Engine, error) {
	eng, err := engine.Open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	if err := eng.Start(ctx, services.Compose(eng.Core())); err != nil {
		return nil, err
	}
	return eng, nil
}
