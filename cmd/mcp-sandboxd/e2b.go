package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// listenE2B opens the E2B listener (e2b.listen), over TLS when a
// certificate is configured. It returns a nil listener when none is
// configured; the caller serves the handler on it and closes it when done.
//
// The keys of e2b.api_key_file are returned for the daemon's authenticator,
// which admits them as admin keys on every front end (pkg/tenants).
func listenE2B(cfg *config.Config, eng *engine.Engine, log *slog.Logger) (net.Listener, *e2bHandler, []string, error) {
	c := cfg.E2B
	if c.Listen == "" {
		return nil, nil, nil, nil
	}
	keys, err := e2b.ReadKeys(c.APIKeyFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("e2b.api_key_file: %w", err)
	}
	var tc *tls.Config
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("e2b.tls_cert: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("e2b.listen: %w", err)
	}
	if tc != nil {
		l = tls.NewListener(l, tc)
	}
	var gwSecret string
	if cfg.Node.GatewaySecretFile != "" {
		// A gateway forwards E2B control-plane calls here too.
		if gwSecret, err = readSecret(cfg.Node.GatewaySecretFile, "node.gateway_secret_file"); err != nil {
			l.Close()
			return nil, nil, nil, err
		}
	}
	srv := e2b.New(e2b.FromEngine(eng), e2b.Options{Auth: eng.Tenants(), Domain: c.Domain, GatewaySecret: gwSecret, Log: log.With("api", "e2b")})
	return l, &e2bHandler{srv, telemetry.HTTP("e2b", srv.TraceRoute, eng.Audit().HTTP("e2b", srv.AuditClassify, srv))}, keys, nil
}

// e2bHandler is the E2B server behind the audit log's recording.
type e2bHandler struct {
	*e2b.Server
	h http.Handler
}

func (e *e2bHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.h.ServeHTTP(w, r) }
