// Package sshd is the SSH endpoint (ssh.listen): OpenSSH's ssh, scp, sftp,
// rsync and editors' remote-SSH reach a sandbox as user "<sandbox id>"
// ("<sandbox id>+root" for uid 0 in a root-mode sandbox). It is a front end
// like pkg/api and pkg/e2b: it authenticates the client, attaches the
// principal to the context and turns SSH channels into calls of the
// engine's existing operations (Backend) — sessions are the agent's PTY or
// pipe jobs, the sftp subsystem is the agent's file operations, ssh -L is
// the agent's connect. It opens no other path into a sandbox.
//
// Security boundaries, enforced here:
//   - no password authentication, ever; a login is a registered public key
//     (pkg/services/sshkeys) or a single-use token, and the sandbox is
//     looked up only after the client proved either, so an unauthenticated
//     client learns nothing about which sandboxes exist;
//   - no agent forwarding, X11 forwarding or remote (-R) forwarding: each
//     would open a path from the sandbox back to the client or the host;
//   - ssh -L reaches only the sandbox's own loopback (the agent dials it
//     inside the sandbox's network namespace), never the host's network;
//   - environment variables from the client are taken from an allow-list
//     (locale, terminal, time zone), so a client cannot set LD_PRELOAD or
//     PATH for the sandbox's processes behind the engine's back.
package sshd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Options configure a Server.
type Options struct {
	// HostKey is the endpoint's host key (engine.SSHHostKey).
	HostKey ssh.Signer
	// Keepalive is how often a client is checked; three intervals without
	// an answer end the connection. 0: never.
	Keepalive time.Duration
	// MaxHandshakes bounds the connections still authenticating (default
	// 64): a flood of idle TCP connections must not hold the daemon's
	// goroutines for handshakeTimeout each without bound. A connection
	// over the bound is closed at once.
	MaxHandshakes int
	Log           *slog.Logger
	// Audit, if not nil, records every login and every refused one
	// (pkg/audit), as the other front ends record their authentications.
	Audit *audit.Log
}

// maxSessions bounds the sessions of one connection, as OpenSSH's
// MaxSessions (10) does.
const maxSessions = 10

// Server serves SSH connections.
type Server struct {
	b    Backend
	opts Options
	cfg  *ssh.ServerConfig

	handshakes chan struct{} // a slot per connection authenticating

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// handshakeTimeout bounds how long a client may take to authenticate.
const handshakeTimeout = 30 * time.Second

// New returns a server over b.
func New(b Backend, opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.MaxHandshakes <= 0 {
		opts.MaxHandshakes = 64
	}
	s := &Server{b: b, opts: opts, conns: map[net.Conn]struct{}{}, handshakes: make(chan struct{}, opts.MaxHandshakes)}
	s.cfg = &ssh.ServerConfig{
		ServerVersion:               "SSH-2.0-mcp-sandboxd",
		MaxAuthTries:                6,
		PublicKeyCallback:           s.publicKey,
		KeyboardInteractiveCallback: s.keyboardInteractive,
		PasswordCallback:            s.password,
	}
	s.cfg.AddHostKey(opts.HostKey)
	return s
}

// Serve accepts connections on l until it is closed or Close is called.
func (s *Server) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.ServeConn(c)
		}()
	}
}

// Close ends every connection and waits for their handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// login is what authentication established, carried in ssh.Permissions.
type login struct {
	sandboxID string
	root      bool
	who       principal.Principal
	method    string
}

// Permissions extension keys (ssh.Permissions carries strings only).
const (
	extSandbox = "sandbox"
	extRoot    = "root"
	extKeyID   = "key_id"
	extKeyName = "key_name"
	extTenant  = "tenant"
	extAdmin   = "admin"
	extMethod  = "method"
)

func (l login) permissions() *ssh.Permissions {
	return &ssh.Permissions{Extensions: map[string]string{
		extSandbox: l.sandboxID, extRoot: strconv.FormatBool(l.root), extKeyID: l.who.KeyID,
		extKeyName: l.who.KeyName, extTenant: l.who.Tenant, extAdmin: strconv.FormatBool(l.who.Admin), extMethod: l.method,
	}}
}

func loginFrom(p *ssh.Permissions) login {
	e := p.Extensions
	return login{sandboxID: e[extSandbox], root: e[extRoot] == "true", method: e[extMethod],
		who: principal.Principal{KeyID: e[extKeyID], KeyName: e[extKeyName], Tenant: e[extTenant], Admin: e[extAdmin] == "true"}}
}

// parseUser splits an SSH user name into a sandbox id and the root flag.
func parseUser(user string) (id string, root bool, err error) {
	id, root = strings.CutSuffix(user, "+root")
	if !strings.HasPrefix(id, "sb-") || len(id) > 64 || strings.ContainsAny(id, "/\x00 +@") {
		return "", false, errdefs.Invalidf("user: must be a sandbox id (sb-...) or sb-...+root, got %.80q", user)
	}
	return id, root, nil
}

// refuse logs an audit line for a refused login and returns the error the
// SSH library answers with; msg, when set, is shown to the client as a
// banner (OpenSSH prints it), so a refusal says why.
func (s *Server) refuse(meta ssh.ConnMetadata, method, reason, msg string) error {
	s.opts.Log.Warn("ssh login refused", "user", meta.User(), "source", meta.RemoteAddr().String(),
		"method", method, "reason", reason)
	s.audit(audit.Record{Source: meta.RemoteAddr().String(), Action: "ssh login (" + method + ")", Target: meta.User(),
		Outcome: audit.Failure, Code: string(errdefs.Unauthenticated)})
	err := errors.New(reason)
	if msg == "" {
		return err
	}
	return &ssh.BannerError{Err: err, Message: "mcp-sandboxd: " + msg + "\r\n"}
}

// admit checks, for an authenticated principal, that the sandbox named by
// the user can be served; it starts no work in the sandbox.
func (s *Server) admit(meta ssh.ConnMetadata, method string, l login) (*ssh.Permissions, error) {
	ctx, cancel := context.WithTimeout(s.context(meta, l), 10*time.Second)
	defer cancel()
	if err := s.b.Access(ctx, l.sandboxID); err != nil {
		return nil, s.refuse(meta, method, "sandbox: "+errdefs.MessageOf(err), errdefs.MessageOf(err))
	}
	s.opts.Log.Info("ssh login", "user", meta.User(), "source", meta.RemoteAddr().String(), "method", method,
		"key_id", l.who.KeyID, "key_name", l.who.KeyName, "tenant", l.who.Tenant)
	s.audit(audit.Record{KeyID: l.who.KeyID, KeyName: l.who.KeyName, Tenant: l.who.Tenant, Admin: l.who.Admin,
		Source: meta.RemoteAddr().String(), Action: "ssh login (" + method + ")", Target: l.sandboxID, Outcome: audit.Success})
	return l.permissions(), nil
}

// audit appends rec, from this front end, to the audit log. The login's
// answer waits for it, as a REST answer waits for its record; a log that
// cannot be written refuses nothing here but is counted (Log.Failures).
func (s *Server) audit(rec audit.Record) {
	if s.opts.Audit == nil {
		return
	}
	rec.FrontEnd = "ssh"
	if err := s.opts.Audit.Append(rec); err != nil {
		s.opts.Log.Error("ssh: audit record not written", "err", err)
	}
}

// context is a request context carrying the login's principal and origin.
func (s *Server) context(meta ssh.ConnMetadata, l login) context.Context {
	ctx := principal.With(context.Background(), l.who)
	return principal.WithOrigin(ctx, principal.Origin{FrontEnd: "ssh", Source: meta.RemoteAddr().String()})
}

func (s *Server) publicKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	id, root, err := parseUser(meta.User())
	if err != nil {
		return nil, s.refuse(meta, "publickey", "bad user", errdefs.MessageOf(err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	who, err := s.b.KeyOwner(ctx, key)
	if err != nil {
		// No banner: the client goes on to its next key, and an
		// unregistered key must not learn anything.
		return nil, s.refuse(meta, "publickey", errdefs.MessageOf(err), "")
	}
	return s.admit(meta, "publickey", login{sandboxID: id, root: root, who: who, method: "publickey"})
}

func (s *Server) keyboardInteractive(meta ssh.ConnMetadata, client ssh.KeyboardInteractiveChallenge) (*ssh.Permissions, error) {
	id, root, err := parseUser(meta.User())
	if err != nil {
		return nil, s.refuse(meta, "token", "bad user", errdefs.MessageOf(err))
	}
	answers, err := client(meta.User(), "mcp-sandboxd: a token from 'sandboxctl ssh' or POST /v1/sandboxes/{id}/ssh-token",
		[]string{"token: "}, []bool{false})
	if err != nil {
		return nil, err
	}
	if len(answers) != 1 || answers[0] == "" {
		return nil, s.refuse(meta, "token", "no token", "no token given")
	}
	who, err := s.b.RedeemToken(strings.TrimSpace(answers[0]), id, root)
	if err != nil {
		return nil, s.refuse(meta, "token", errdefs.MessageOf(err), "token refused: "+errdefs.MessageOf(err))
	}
	return s.admit(meta, "token", login{sandboxID: id, root: root, who: who, method: "token"})
}

func (s *Server) password(meta ssh.ConnMetadata, _ []byte) (*ssh.Permissions, error) {
	return nil, s.refuse(meta, "password", "password authentication is not offered",
		"password authentication is not offered; log in with a key registered by 'sandboxctl ssh-keys add' or with 'sandboxctl ssh ID'")
}

// ServeConn runs one SSH connection to its end.
func (s *Server) ServeConn(c net.Conn) {
	if !s.track(c) {
		_ = c.Close()
		return
	}
	defer s.untrack(c)
	defer c.Close()
	select {
	case s.handshakes <- struct{}{}:
	default:
		s.opts.Log.Warn("ssh connection refused: too many authenticating", "source", c.RemoteAddr().String(), "max", s.opts.MaxHandshakes)
		return
	}
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	<-s.handshakes
	if err != nil {
		s.opts.Log.Debug("ssh handshake", "source", c.RemoteAddr().String(), "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	l := loginFrom(sc.Permissions)
	ctx, cancel := context.WithCancel(s.context(sc, l))
	defer cancel()
	cn := &conn{s: s, sc: sc, login: l, ctx: ctx, log: s.opts.Log.With("sandbox_id", l.sandboxID, "source", sc.RemoteAddr().String())}
	go cn.globalRequests(reqs)
	go cn.watchSandbox()
	if s.opts.Keepalive > 0 {
		go cn.keepalive(s.opts.Keepalive)
	}
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			go cn.session(nc)
		case "direct-tcpip":
			go cn.directTCPIP(nc)
		default:
			_ = nc.Reject(ssh.UnknownChannelType, fmt.Sprintf("mcp-sandboxd: channel type %q is not offered", nc.ChannelType()))
		}
	}
	// The client is gone: forwards end with the context, sessions kill
	// what they still run.
	cancel()
	cn.endSessions("")
	cn.wg.Wait()
}
