package client

import (
	"context"
	"net"
	"net/http"
	"net/url"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// SSHEndpoint returns where the SSH endpoint listens and its host key
// (GET /v1/ssh).
func (c *Client) SSHEndpoint(ctx context.Context) (*apitypes.SSHEndpoint, error) {
	var ep apitypes.SSHEndpoint
	return &ep, c.doJSON(ctx, http.MethodGet, "/v1/ssh", nil, nil, &ep)
}

// SSHKeys lists the registered SSH public keys (GET /v1/ssh/keys).
func (c *Client) SSHKeys(ctx context.Context) ([]apitypes.SSHKey, error) {
	var l apitypes.SSHKeyList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/ssh/keys", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Keys, nil
}

// AddSSHKey registers a public key (POST /v1/ssh/keys).
func (c *Client) AddSSHKey(ctx context.Context, req apitypes.SSHKeyAddRequest) (*apitypes.SSHKey, error) {
	var k apitypes.SSHKey
	return &k, c.doJSON(ctx, http.MethodPost, "/v1/ssh/keys", nil, req, &k, http.StatusCreated)
}

// RemoveSSHKey removes a key by id or fingerprint (DELETE /v1/ssh/keys/{key}).
func (c *Client) RemoveSSHKey(ctx context.Context, key string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/ssh/keys/"+url.PathEscape(key), nil, nil, nil, http.StatusNoContent)
}

// SSHToken mints a single-use login token for a sandbox
// (POST /v1/sandboxes/{id}/ssh-token).
func (c *Client) SSHToken(ctx context.Context, req apitypes.SSHTokenRequest) (*apitypes.SSHToken, error) {
	var t apitypes.SSHToken
	return &t, c.doJSON(ctx, http.MethodPost, sandboxPath(req.SandboxID, "/ssh-token"), nil, req, &t)
}

// DialSSH opens an SSH connection to the daemon's SSH endpoint through the
// API (GET /v1/ssh/connect, a WebSocket), for sandboxctl ssh-proxy where
// ssh.listen is not reachable. The caller speaks SSH over it.
func (c *Client) DialSSH(ctx context.Context) (net.Conn, error) {
	return c.dialSSH(ctx, "/v1/ssh/connect")
}

// DialSSHFor is DialSSH through sandbox id's path
// (GET /v1/sandboxes/{id}/ssh/connect), which a gateway routes to the node
// that holds the sandbox.
func (c *Client) DialSSHFor(ctx context.Context, id string) (net.Conn, error) {
	return c.dialSSH(ctx, sandboxPath(id, "/ssh/connect"))
}

func (c *Client) dialSSH(ctx context.Context, path string) (net.Conn, error) {
	conn, err := c.dial(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	return websocket.NetConn(context.WithoutCancel(ctx), conn, websocket.MessageBinary), nil
}
