package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
)

func stdioCmd() *cobra.Command {
	var level, remote string
	cmd := runtimeCmd(&cobra.Command{
		Use:   "stdio",
		Short: "Serve MCP over stdin/stdout for one client (through the running daemon, else in-process as root)",
		Long: `Serve MCP over stdin/stdout for one client, e.g.

  claude mcp add sandbox -- mcp-sandboxd stdio

When a daemon answers on server.socket, the session is carried to the
daemon's /mcp endpoint: any number of clients, run by root or by members of
server.socket_group (make install creates the group mcp-sandboxd). Without a
daemon, root runs the engine in this process, holding the state directory's
lock (one such client at a time); anyone else gets a JSON-RPC error on every
request saying how to start the daemon. With --url the session is carried
to that daemon's or gateway's /mcp over HTTP instead, with the bearer key in
SANDBOXD_TOKEN (e.g. --url http://gateway:7080 for a fleet). Logs go to
stderr (warnings and errors unless --log-level says otherwise), never to
stdout.`,
	}, func(ctx context.Context, cfg *config.Config, _ *slog.Logger) error {
		// MCP clients show every stderr line as an error: stdio logs
		// warnings and errors only, unless --log-level says otherwise.
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return &exitError{code: 2, err: fmt.Errorf("--log-level: %v", err)}
		}
		cfg.Log.Level = level
		if remote != "" {
			return bridgeRemote(ctx, remote, os.Getenv("SANDBOXD_TOKEN"), newLogger(cfg.Log, os.Stderr))
		}
		return serveStdio(ctx, cfg, newLogger(cfg.Log, os.Stderr))
	})
	cmd.Flags().StringVar(&level, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	cmd.Flags().StringVar(&remote, "url", "", "carry the session to the /mcp of this daemon or gateway (http://HOST:PORT), bearer key in SANDBOXD_TOKEN")
	return cmd
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
		log.Debug("mcp stdio: using the running daemon", "socket", cfg.Server.Socket)
		return mcpserver.Bridge(ctx, dial, os.Stdin, os.Stdout, log)
	}
	daemonErr := err
	refuse := func(why string) error {
		log.Error("mcp stdio: " + why)
		return mcpserver.Refuse(ctx, os.Stdin, os.Stdout, why)
	}
	if os.Geteuid() != 0 {
		return refuse(fmt.Sprintf("mcp-sandboxd stdio needs the mcp-sandboxd daemon or root: no daemon answers on %s (%v). "+
			"Start it (sudo systemctl start mcp-sandboxd, or sudo mcp-sandboxd serve) and make sure this user is in the socket's group %q "+
			"(sudo usermod -aG %s $USER, then log in again), or run this server as root.",
			cfg.Server.Socket, daemonErr, cfg.Server.SocketGroup, cfg.Server.SocketGroup))
	}
	log.Debug("mcp stdio: no daemon answers; running the engine in-process", "socket", cfg.Server.Socket, "reason", daemonErr)
	// Marked (re-executed, nothing read from stdin yet) like a daemon: what
	// the in-process engine starts is found the same way after a crash.
	if err := lifetime.EnsureMarked(cfg.Paths.StateDir); err != nil {
		return refuse(err.Error())
	}
	if err := lifetime.CloseInheritedOnExec(); err != nil {
		return refuse(err.Error())
	}
	lock, err := lockStateDir(cfg, log)
	if err != nil {
		return refuse(fmt.Sprintf("mcp-sandboxd stdio without a daemon serves one client at a time and another one holds %s (%v). "+
			"Start the daemon (sudo systemctl start mcp-sandboxd, or sudo mcp-sandboxd serve) for any number of clients.",
			cfg.Paths.StateDir, err))
	}
	defer lock.Close()
	releaseNames, err := claimHostNames(cfg)
	if err != nil {
		return refuse(err.Error())
	}
	defer releaseNames()
	stopTraces, err := startTelemetry(ctx, cfg.Telemetry, log)
	if err != nil {
		return refuse(fmt.Sprintf("mcp-sandboxd stdio: telemetry: %v", err))
	}
	defer stopTraces()
	eng, err := compose(ctx, cfg, log)
	if err != nil {
		return refuse(fmt.Sprintf("mcp-sandboxd stdio: cannot start the engine in-process: %v", err))
	}
	defer eng.Close()
	// Previews work in-process too; a port in use (a daemon's) only costs
	// the client sandbox_expose_port, which then says why.
	if pl, ph, err := listenPreview(cfg, eng, log); err != nil {
		log.Warn("mcp stdio: no preview listener", "err", err)
	} else if pl != nil {
		srv := &http.Server{Handler: ph, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { _ = srv.Serve(pl) }()
		defer ph.Close()
		defer srv.Close()
	}
	return mcpserver.ServeStdio(ctx, eng, mcpserver.Options{Log: log, Audit: eng.Audit(), Webhooks: eng.Webhooks(), Replays: eng.Replays()}, os.Stdin, os.Stdout)
}

// bridgeRemote carries the stdio session to base's /mcp (a daemon's TCP
// listener or a gateway) with token as the bearer key.
func bridgeRemote(ctx context.Context, base, token string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return &exitError{code: 2, err: fmt.Errorf("--url: want http://HOST:PORT or https://HOST:PORT, got %q", base)}
	}
	if token == "" {
		return &exitError{code: 2, err: errors.New("--url: SANDBOXD_TOKEN must hold the bearer key")}
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/mcp"
	rt := bearer{token: token, next: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 16}}
	return mcpserver.BridgeTo(ctx, u.String(), rt, os.Stdin, os.Stdout, log)
}

// bearer adds the key to every request of the bridge.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
