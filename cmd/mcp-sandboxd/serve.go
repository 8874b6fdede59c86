package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sshd"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// drainTimeout bounds how long SIGTERM waits for in-flight requests.
const drainTimeout = 30 * time.Second

func serveCmd() *cobra.Command {
	return runtimeCmd(&cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: REST and MCP on the unix socket and HTTP, health and metrics",
	}, serve)
}

// runtimeCmd completes cmd into a command that loads the configuration
// (--config), logs to stderr as it says, and runs run.
func runtimeCmd(cmd *cobra.Command, run func(context.Context, *config.Config, *slog.Logger) error) *cobra.Command {
	var cfgPath string
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(cfgPath)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		return run(cmd.Context(), cfg, newLogger(cfg.Log, os.Stderr))
	}
	cmd.Flags().StringVar(&cfgPath, "config", config.DefaultPath, "configuration file (missing default file: built-in defaults)")
	return cmd
}

// loadConfig reads path; the default path may be absent (then the documented
// defaults apply, with environment overrides), an explicit one may not.
func loadConfig(path string) (*config.Config, error) {
	if path == config.DefaultPath {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return config.Parse(nil)
		}
	}
	return config.Load(path)
}

func newLogger(c config.Log, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// lockStartTimeout bounds how long a start waits for the state lock after
// it ended an earlier daemon's leftovers (they die at once on SIGKILL).
const lockStartTimeout = 2 * time.Second

// lockStateDir takes the state directory's exclusive lock, so that two
// daemons (or a daemon and an in-process stdio server) never share state.
// The lock is released when the process exits, however it exits — and
// when every process sharing its descriptor exits, which is why nothing
// the daemon starts may inherit it.
//
// The lock file names the pid of its holder. That pid alive and marked as
// a daemon of this directory (pkg/lifetime) means another daemon runs: the
// start is refused. Otherwise the processes an earlier daemon left (marked,
// not a sandbox's) are ended first, so that a stale pid or a flock held by
// an orphan never keeps the daemon down.
func lockStateDir(cfg *config.Config, log *slog.Logger) (*os.File, error) {
	dir := cfg.Paths.StateDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	tryLock := func() (bool, error) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	}
	locked, err := tryLock()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if !locked {
		holder, _ := os.ReadFile(path)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(holder))); err == nil && pid != os.Getpid() && lifetime.Daemon(pid, dir) {
			f.Close()
			return nil, fmt.Errorf("state directory %s is in use by another mcp-sandboxd (pid %d)", dir, pid)
		}
	}
	// No live daemon here: end what earlier ones left — sandboxes (in the
	// sandbox cgroups; QEMU and swtpm carry no marker) stay, to be adopted.
	keep := func(pid int) bool { return lifetime.InCgroup(pid, cfg.Sandbox.CgroupParent) }
	killed, err := lifetime.Sweep(dir, keep, lockStartTimeout)
	if len(killed) > 0 {
		log.Warn("ended processes an earlier mcp-sandboxd left behind", "pids", killed)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	for deadline := time.Now().Add(lockStartTimeout); !locked; time.Sleep(10 * time.Millisecond) {
		if locked, err = tryLock(); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock state dir: %w", err)
		}
		if !locked && time.Now().After(deadline) {
			holders := lifetime.LockHolders(f)
			f.Close()
			return nil, fmt.Errorf("state directory %s is locked by pid %v, which carries no %s marker of it (a daemon older than the marker, or another program)", dir, holders, lifetime.MarkerVar)
		}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	return f, nil
}

// readToken reads the HTTP bearer token, creating a random one (0600) on
// first start so that HTTP is never served without authentication.
func readToken(path string, log *slog.Logger) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		tok := hex.EncodeToString(b)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return "", fmt.Errorf("server.auth_token_file: %w", err)
		}
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("server.auth_token_file: %w", err)
		}
		log.Info("created a new HTTP bearer token", "file", path)
		return tok, nil
	}
	if err != nil {
		return "", fmt.Errorf("server.auth_token_file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if len(tok) < 16 {
		return "", fmt.Errorf("server.auth_token_file: %s holds a token shorter than 16 characters", path)
	}
	return tok, nil
}

// uiBaseURL is the web editor's address for login URLs: the HTTP listener,
// with a wildcard host replaced by loopback (a browser cannot open 0.0.0.0).
// Empty when there is no HTTP listener.
func uiBaseURL(httpAddr string) string {
	if httpAddr == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return "" // validated by config
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// listenUnix listens on the API socket, owned by root and
// server.socket_group with server.socket_mode: the file mode is the access
// control of the unauthenticated socket.
func listenUnix(sc config.Server, log *slog.Logger) (net.Listener, error) {
	path := sc.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("server.socket: %w", err)
	}
	// Bound under a temporary name, given its owner and mode, and only then
	// renamed over the socket path: a socket file a dead daemon left (and,
	// in the worst case, a listener a leftover of it still holds) is
	// replaced in one step, so a client connects either to nothing or to
	// this daemon, never queues on a dead listener, and never finds the
	// socket with the wrong mode. We hold the state lock, so no live daemon
	// of ours owns either name.
	tmp := path + ".new"
	// sun_path holds 108 bytes with the terminating NUL.
	if len(tmp) > 107 {
		return nil, fmt.Errorf("server.socket: %s is too long for a unix socket (with the temporary suffix .new: %d bytes, at most 107)", path, len(tmp))
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("server.socket: remove stale %s: %w", tmp, err)
	}
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", tmp)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("server.socket: %w", err)
	}
	// Closing must not unlink the temporary name (it is gone; the socket
	// path is removed by serve).
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		l.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	// The socket's owner, group and mode are the access control of the
	// unauthenticated socket API (REST and MCP): root and members of
	// server.socket_group.
	if sc.SocketGroup != "" {
		gid, err := lookupGroup(sc.SocketGroup)
		if err != nil {
			log.Warn("server.socket_group: the socket stays root's", "group", sc.SocketGroup, "err", err)
		} else if err := os.Lchown(tmp, 0, gid); err != nil {
			return fail(fmt.Errorf("server.socket_group: %w", err))
		}
	}
	if err := os.Chmod(tmp, sc.SocketPerm()); err != nil {
		return fail(fmt.Errorf("server.socket_mode: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("server.socket: %w", err))
	}
	// The group reaches the socket only through its directory, which the
	// engine may have created 0700 (the run dir): let others search it, not
	// list it. What is inside keeps its own modes (sandboxes/ is 0700); the
	// socket's mode stays the access control.
	if sc.SocketPerm()&0o077 != 0 {
		dir := filepath.Dir(path)
		if st, err := os.Stat(dir); err == nil && st.Mode().Perm()&0o011 != 0o011 {
			if err := os.Chmod(dir, st.Mode().Perm()|0o011); err != nil {
				l.Close()
				return nil, fmt.Errorf("server.socket: let the group reach the socket: %w", err)
			}
		}
	}
	return l, nil
}

// lookupGroup resolves a group name (or a numeric gid).
func lookupGroup(name string) (int, error) {
	if g, err := user.LookupGroup(name); err == nil {
		return strconv.Atoi(g.Gid)
	}
	if gid, err := strconv.Atoi(name); err == nil {
		return gid, nil
	}
	return 0, fmt.Errorf("no group %q (make install creates it: groupadd --system %s)", name, name)
}

func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if err := lifetime.EnsureMarked(cfg.Paths.StateDir); err != nil {
		return err
	}
	if err := lifetime.CloseInheritedOnExec(); err != nil {
		return err
	}
	lock, err := lockStateDir(cfg, log)
	if err != nil {
		return err
	}
	defer lock.Close()
	releaseNames, err := claimHostNames(cfg)
	if err != nil {
		return err
	}
	defer releaseNames()

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// Deferred before the engine's Close and the servers' drain return, so
	// it runs after them: their last spans are flushed too.
	stopTraces, err := startTelemetry(ctx, cfg.Telemetry, log)
	if err != nil {
		return err
	}
	defer stopTraces()

	eng, err := compose(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer eng.Close()

	// Every listener is opened (and the token read or created) before any
	// of them serves: a client that sees the socket answer can rely on the
	// HTTP listener and its token file being there too.
	ls := &listenerSet{}
	defer ls.close()
	if err := ls.open(cfg, eng, log); err != nil {
		return err
	}
	// Start-up touched much of the binary once; keep resident only what
	// serving touches again (textpages.go). Before serving: a client that
	// sees the daemon answer sees it trimmed.
	unmapBinaryHugePages(log)
	servers, errc := ls.serve(log)

	// Only now can clients connect: tell systemd (Type=notify).
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify READY", "err", err)
	}
	if iv, err := daemon.SdWatchdogEnabled(false); err == nil && iv > 0 {
		go watchdog(ctx, eng, iv/2, log)
	}
	log.Info("mcp-sandboxd ready", "version", version.Version, "socket", cfg.Server.Socket, "http", cfg.Server.HTTPAddr)

	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("server failed", "err", err)
		_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
		return err
	}
	log.Info("shutting down: draining requests; sandboxes keep running")
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(dctx); err != nil {
			log.Warn("drain", "err", err)
		}
	}
	return nil
}

// listener is one HTTP listener of the daemon and what it serves.
type listener struct {
	l    net.Listener
	h    http.Handler
	what string
}

// listenerSet is the daemon's listeners: the HTTP ones, the SSH one, and
// what closes them (and their handlers) in the reverse of their opening.
type listenerSet struct {
	ls      []listener
	ssh     *sshd.Server
	sshL    net.Listener
	closers []func()
}

// close runs the closers, last registered first (as defers would).
func (s *listenerSet) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// open opens every listener: SSH, the unix socket, HTTP, preview and E2B;
// the token file's token and the E2B keys become the tenants' file keys.
func (s *listenerSet) open(cfg *config.Config, eng *engine.Engine, log *slog.Logger) error {
	sl, ss, err := listenSSH(cfg, eng, log)
	if err != nil {
		return err
	}
	var sshConn func(net.Conn) // GET /v1/ssh/connect (sandboxctl ssh-proxy)
	if ss != nil {
		s.closers = append(s.closers, func() { ss.Close() }, func() { sl.Close() })
		s.ssh, s.sshL, sshConn = ss, sl, ss.ServeConn
	}
	s.closers = append(s.closers, func() {
		for _, l := range s.ls {
			_ = l.l.Close()
		}
	})

	ul, err := listenUnix(cfg.Server, log)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, func() { os.Remove(cfg.Server.Socket) })
	// MCP is served on both listeners: behind the token on TCP, and on the
	// socket for `mcp-sandboxd stdio`, which bridges to it.
	mcpH := mcpserver.NewHandler(eng, mcpserver.Options{Log: log, Audit: eng.Audit(), Webhooks: eng.Webhooks(), Replays: eng.Replays()}) // the rest from cfg.Server
	// The web editor's logins and sessions, shared by both listeners:
	// `sandboxctl ui` mints a login URL on the socket, the browser uses it
	// over HTTP.
	ui := api.NewUIAuth(api.UIAuthOptions{BaseURL: uiBaseURL(cfg.Server.HTTPAddr)})
	s.ls = append(s.ls, listener{ul, api.NewHandler(eng, api.Options{Log: log, MCP: mcpH, UI: ui, Audit: eng.Audit(), SSHConn: sshConn, Webhooks: eng.Webhooks(), Replays: eng.Replays(), MaxBodyBytes: int64(cfg.Server.MaxRequestBytes)}), "unix"})

	token, err := s.openHTTP(cfg, eng, log, api.Options{Auth: eng.Tenants(), Log: log, MCP: mcpH, UI: ui, Audit: eng.Audit(), SSHConn: sshConn, Webhooks: eng.Webhooks(), Replays: eng.Replays(), MaxBodyBytes: int64(cfg.Server.MaxRequestBytes)})
	if err != nil {
		return err
	}

	pl, ph, err := listenPreview(cfg, eng, log)
	if err != nil {
		return err
	}
	if pl != nil {
		s.closers = append(s.closers, func() { ph.Close() })
		s.ls = append(s.ls, listener{pl, ph, "preview"})
	}
	el, eh, e2bKeys, err := listenE2B(cfg, eng, log)
	if err != nil {
		return err
	}
	eng.Tenants().SetFileKeys(token, e2bKeys)
	if el != nil {
		s.closers = append(s.closers, func() { eh.Close() })
		s.ls = append(s.ls, listener{el, eh, "e2b"})
	}
	// A gateway reaches these listeners on the node's host (GET /v1/node).
	eng.SetListenerPorts(tcpPort(el), tcpPort(pl))
	return nil
}

// openHTTP opens the TCP listener (server.http_addr; none when empty)
// with the REST API over opt, and returns the token file's token: the
// first admin key of the one authenticator (pkg/tenants) every TCP front
// end shares.
func (s *listenerSet) openHTTP(cfg *config.Config, eng *engine.Engine, log *slog.Logger, opt api.Options) (string, error) {
	if cfg.Server.HTTPAddr == "" {
		return "", nil
	}
	token, err := readToken(cfg.Server.AuthTokenFile, log)
	if err != nil {
		return "", err
	}
	if cfg.Node.GatewaySecretFile != "" {
		if opt.GatewaySecret, err = readSecret(cfg.Node.GatewaySecretFile, "node.gateway_secret_file"); err != nil {
			return "", err
		}
	}
	tl, err := net.Listen("tcp", cfg.Server.HTTPAddr)
	if err != nil {
		return "", fmt.Errorf("server.http_addr: %w", err)
	}
	s.ls = append(s.ls, listener{tl, api.NewHandler(eng, opt), "http"})
	return token, nil
}

// serve starts serving every listener; errc receives the first one's
// failure.
func (s *listenerSet) serve(log *slog.Logger) ([]*http.Server, chan error) {
	var servers []*http.Server
	errc := make(chan error, len(s.ls)+1)
	if s.sshL != nil {
		go func() {
			if err := s.ssh.Serve(s.sshL); err != nil {
				errc <- fmt.Errorf("ssh: %w", err)
			}
		}()
		log.Info("serving", "api", "ssh", "addr", s.sshL.Addr().String())
	}
	for _, l := range s.ls {
		// IdleTimeout closes keep-alive connections idle between requests
		// (a client that leaks them would otherwise grow the daemon's
		// descriptors and goroutines without bound); it does not touch a
		// request in progress, so streams and WebSockets are unaffected.
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		servers = append(servers, srv)
		go func(l listener) {
			if err := srv.Serve(l.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", l.what, err)
			}
		}(l)
		log.Info("serving", "api", l.what, "addr", l.l.Addr().String())
	}
	return servers, errc
}

// watchdog pings systemd while the engine's store answers, so a wedged
// daemon is restarted (WatchdogSec in the unit).
func watchdog(ctx context.Context, eng *engine.Engine, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, every)
		err := eng.Healthy(cctx)
		cancel()
		if err != nil {
			log.Error("watchdog: withholding the ping", "err", err)
			continue
		}
		if _, err := daemon.SdNotify(false, daemon.SdNotifyWatchdog); err != nil {
			log.Warn("sd_notify WATCHDOG", "err", err)
		}
	}
}

// tcpPort is l's TCP port, 0 for none.
func tcpPort(l net.Listener) int {
	if l == nil {
		return 0
	}
	if a, ok := l.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}
