package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway/remote"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/kubediscovery"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/preview"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/tenants"
)

func gatewayCmd() *cobra.Command {
	return runtimeCmd(&cobra.Command{
		Use:   "gateway",
		Short: "Run a stateless gateway in front of node daemons: places creates, routes by sandbox id",
	}, runGateway)
}

// runGateway serves the gateway on gateway.listen until SIGTERM or SIGINT.
// It holds no sandbox state: only the tenants store the gateways share and
// a cache of what lists showed.
func runGateway(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	g := cfg.Gateway
	if g.Listen == "" {
		return &exitError{code: 2, err: errors.New("gateway.listen: required for mcp-sandboxd gateway")}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	disc, err := gatewayDiscovery(ctx, g, log)
	if err != nil {
		return err
	}
	secret, err := readSecret(g.SecretFile, "gateway.secret_file")
	if err != nil {
		return err
	}
	token, err := readToken(g.AuthTokenFile, log)
	if err != nil {
		return fmt.Errorf("gateway.auth_token_file: %w", err)
	}
	keys, fleet, closeStore, err := gatewayTenants(ctx, cfg, token, log)
	if err != nil {
		return err
	}
	defer closeStore()
	h := gateway.New(gateway.Options{
		Discovery: disc, Auth: keys, Keys: keys, KeyAdmin: keys, Fleet: fleet, Secret: secret,
		NodeTimeout: g.NodeTimeout.D(), ProbeInterval: g.ProbeInterval.D(), ReconcileInterval: g.ReconcileInterval.D(),
		MaxBodyBytes: int64(cfg.Server.MaxRequestBytes), Log: log,
		// /mcp: the real MCP server over the nodes' REST API (tools,
		// sessions and tasks live in this gateway; the work on the nodes).
		MCP: func(gw *gateway.Gateway) http.Handler {
			re := remote.New(gw, cfg)
			return mcpserver.NewHandler(re, mcpserver.Options{Log: log, Replays: re})
		},
	})
	go h.Reconcile(ctx)
	return serveGateway(ctx, g, h, log)
}

// serveGateway serves the REST listener, and the E2B and preview
// listeners when set, until ctx ends or one of them fails; then it
// drains the requests in flight (10 s at most).
func serveGateway(ctx context.Context, g config.Gateway, h *gateway.Gateway, log *slog.Logger) error {
	type listener struct {
		key, addr string
		h         http.Handler
	}
	ls := []listener{{"gateway.listen", g.Listen, h}}
	if g.E2BListen != "" {
		ls = append(ls, listener{"gateway.e2b_listen", g.E2BListen, h.E2B(g.E2BDomain)})
	}
	if g.PreviewListen != "" {
		ls = append(ls, listener{"gateway.preview_listen", g.PreviewListen, h.Preview()})
	}
	var srvs []*http.Server
	done := make(chan error, len(ls))
	for _, l := range ls {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, s := range srvs {
				s.Close()
			}
			return fmt.Errorf("%s: %w", l.key, err)
		}
		if l.key == "gateway.preview_listen" {
			h.SetPreviewURL(cmp.Or(g.PreviewURL, preview.BaseURL(ln.Addr())))
		}
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 30 * time.Second}
		srvs = append(srvs, srv)
		go func() { done <- srv.Serve(ln) }()
		log.Info("gateway listening", "listener", l.key, "addr", ln.Addr().String(), "static_nodes", len(g.Nodes), "kubernetes_service", g.Kubernetes.Service)
	}
	var serveErr error
	select {
	case serveErr = <-done:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range srvs {
		if err := s.Shutdown(sctx); err != nil && serveErr == nil {
			serveErr = err
		}
	}
	return serveErr
}

// gatewayTenants opens the keys the gateways share. The fleet's
// PostgreSQL (store.postgres_url) holds the keys, the fleet-wide quota
// counts and the audit rows every gateway shares; without it, a SQLite
// file (gateway.state_db) holds the keys and there are neither (fleet
// nil). closeStore closes what was opened.
func gatewayTenants(ctx context.Context, cfg *config.Config, token string, log *slog.Logger) (keys *tenants.Service, fleet gateway.FleetStore, closeStore func(), err error) {
	var keyStore tenants.KeyStore
	if url := cfg.Store.PostgresURL; url != "" {
		pg, err := pgstore.Open(ctx, url)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("store.postgres_url: %w", err)
		}
		keyStore, fleet, closeStore = pg, pg, pg.Close
	} else {
		st, err := store.Open(ctx, cfg.Gateway.StateDB)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("gateway.state_db: %w", err)
		}
		keyStore, closeStore = st, func() { st.Close() }
	}
	keys, err = tenants.New(ctx, tenants.Options{Store: keyStore, AdminToken: token, Log: log})
	if err != nil {
		closeStore()
		return nil, nil, nil, err
	}
	inner := closeStore
	closeStore = func() { keys.Close(); inner() }
	return keys, fleet, closeStore, nil
}

// gatewayDiscovery is where the gateway finds its nodes: the Kubernetes
// API (gateway.kubernetes, the Helm chart's gateway) or the static list.
func gatewayDiscovery(ctx context.Context, g config.Gateway, log *slog.Logger) (gateway.Discovery, error) {
	if k := g.Kubernetes; k.Service != "" {
		d, err := kubediscovery.NewInCluster(kubediscovery.Config{
			Namespace: k.Namespace, Service: k.Service, PortName: k.PortName, Logger: log,
		})
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("gateway.kubernetes: %w", err)}
		}
		// Not waited for: until the first list is in, Nodes answers
		// unavailable and the gateway's creates and lists say so.
		go func() {
			if err := d.Start(ctx); err != nil && ctx.Err() == nil {
				log.Error("kubernetes node discovery", "err", err)
			}
		}()
		return kubeNodes{d}, nil
	}
	if len(g.Nodes) == 0 {
		return nil, &exitError{code: 2, err: errors.New("gateway.nodes: required (at least one node, or gateway.kubernetes) for mcp-sandboxd gateway")}
	}
	static := gateway.Static(g.Nodes)
	if nodes, _ := static.Nodes(ctx); gateway.CheckTags(nodes) != nil {
		return nil, &exitError{code: 2, err: gateway.CheckTags(nodes)}
	}
	return static, nil
}

// kubeNodes is pkg/kubediscovery's node list as the gateway's Discovery.
// Its capacity hints are not passed on: the gateway asks each node
// (GET /v1/node), which knows its live use as well as its limits.
type kubeNodes struct{ d *kubediscovery.Discovery }

// Nodes implements gateway.Discovery.
func (k kubeNodes) Nodes(ctx context.Context) ([]gateway.Node, error) {
	kn, err := k.d.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	nodes := make([]gateway.Node, 0, len(kn))
	for _, n := range kn {
		nodes = append(nodes, gateway.Node{Name: n.Name, URL: n.URL, Ready: n.Ready, Draining: n.Draining})
	}
	return nodes, nil
}

// readSecret reads a shared secret that an operator provisions (never
// created here: both sides must hold the same one).
func readSecret(path, key string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	s := strings.TrimSpace(string(b))
	if len(s) < 16 {
		return "", fmt.Errorf("%s: %s holds a secret shorter than 16 characters", key, path)
	}
	return s, nil
}
