package main

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sshd"
)

// listenSSH opens the SSH endpoint (ssh.listen), generating its host key
// in the state directory the first time. It returns a nil listener when
// the endpoint is off; the caller serves on it and closes the server.
func listenSSH(cfg *config.Config, eng *engine.Engine, log *slog.Logger) (net.Listener, *sshd.Server, error) {
	if cfg.SSH.Listen == "" {
		return nil, nil, nil
	}
	key, err := eng.SSHHostKey()
	if err != nil {
		return nil, nil, fmt.Errorf("ssh host key: %w", err)
	}
	l, err := net.Listen("tcp", cfg.SSH.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh.listen: %w", err)
	}
	return l, sshd.New(sshd.FromEngine(eng), sshd.Options{HostKey: key, Keepalive: cfg.SSH.Keepalive.D(), Log: log.With("api", "ssh"), Audit: eng.Audit()}), nil
}
