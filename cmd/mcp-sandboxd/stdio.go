package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
)

func stdioCmd() *cobra.Command {
	return runtimeCmd(&cobra.Command{
		Use:   "stdio",
		Short: "Serve MCP over stdin/stdout for one client (through the running daemon, else in-process)",
		Long: `Serve MCP over stdin/stdout for one client, e.g.

  claude mcp add sandbox -- mcp-sandboxd stdio

When a daemon answers on server.socket, the session is carried to the
daemon's /mcp endpoint; otherwise the engine runs in this process, holding
the state directory's lock. Logs go to stderr, never to stdout.`,
	}, serveStdio)
}

func serveStdio(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.Server.Socket)
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	conn, err := dial(dctx)
	cancel()
	if err == nil {
		conn.Close()
		log.Info("mcp stdio: using the running daemon", "socket", cfg.Server.Socket)
		return mcpserver.Bridge(ctx, dial, os.Stdin, os.Stdout, log)
	}
	log.Info("mcp stdio: no daemon answers; running the engine in-process", "socket", cfg.Server.Socket, "reason", err)

	lock, err := lockStateDir(cfg.Paths.StateDir)
	if err != nil {
		return fmt.Errorf("%w (is a daemon starting? it serves MCP on %s)", err, cfg.Server.Socket)
	}
	defer lock.Close()
	eng, err := engine.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer eng.Close()
	return mcpserver.ServeStdio(ctx, eng, mcpserver.Options{Log: log}, os.Stdin, os.Stdout)
}
