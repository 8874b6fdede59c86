package engine

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/sshkeys"
)

// sshState is the engine's part of the SSH endpoint: the identity service
// and the host key, loaded once.
type sshState struct {
	sshKeys   *sshkeys.Service
	sshHostMu sync.Mutex
	sshHost   ssh.Signer
}

// The SSH identities are the sshkeys service's (pkg/services/sshkeys);
// these methods keep the engine the one facade the REST front end and the
// SSH endpoint (pkg/sshd) are served by. The SSH endpoint reaches a
// sandbox only through the engine's existing operations: OpenProcess for
// sessions, the file operations for SFTP, DialPort (the agent's connect)
// for forwarding.

// SSHHostKeyFile is the host key's file name in paths.state_dir.
const SSHHostKeyFile = "ssh_host_ed25519_key"

// SSHKeyAdd registers a public key for the calling principal.
func (e *Engine) SSHKeyAdd(ctx context.Context, req apitypes.SSHKeyAddRequest) (*apitypes.SSHKey, error) {
	return e.sshKeys.Add(ctx, req)
}

// SSHKeyList lists the keys the calling principal may see.
func (e *Engine) SSHKeyList(ctx context.Context) (*apitypes.SSHKeyList, error) {
	return e.sshKeys.List(ctx)
}

// SSHKeyRemove removes a key by id or fingerprint.
func (e *Engine) SSHKeyRemove(ctx context.Context, id string) error {
	return e.sshKeys.Remove(ctx, id)
}

// SSHHostKey is the SSH endpoint's host key, generated in the state
// directory the first time it is asked for.
func (e *Engine) SSHHostKey() (ssh.Signer, error) {
	e.sshHostMu.Lock()
	defer e.sshHostMu.Unlock()
	if e.sshHost == nil {
		k, err := sshkeys.HostKey(filepath.Join(e.cfg.Paths.StateDir, SSHHostKeyFile))
		if err != nil {
			return nil, err
		}
		e.sshHost = k
	}
	return e.sshHost, nil
}

// SSHEndpoint says where the SSH endpoint listens and its host key.
func (e *Engine) SSHEndpoint(ctx context.Context) (*apitypes.SSHEndpoint, error) {
	out := &apitypes.SSHEndpoint{Listen: e.cfg.SSH.Listen}
	if out.Listen == "" {
		return out, nil
	}
	k, err := e.SSHHostKey()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "ssh host key")
	}
	out.HostKey = sshAuthorizedKey(k.PublicKey())
	return out, nil
}

// SSHToken mints a single-use token for one SSH login to a live sandbox.
func (e *Engine) SSHToken(ctx context.Context, req apitypes.SSHTokenRequest) (*apitypes.SSHToken, error) {
	if e.cfg.SSH.Listen == "" {
		return nil, errdefs.Unavailablef("ssh: the SSH endpoint is off (set ssh.listen)")
	}
	ttl := e.cfg.SSH.TokenTTL.D()
	if req.TTLSeconds != 0 {
		d, err := duration("ttl_seconds", req.TTLSeconds, 0)
		if err != nil {
			return nil, err
		}
		if d > config.MaxSSHTokenTTL {
			return nil, errdefs.Invalidf("ttl_seconds: at most %d", int(config.MaxSSHTokenTTL/time.Second))
		}
		ttl = d
	}
	if err := e.SSHAccess(ctx, req.SandboxID); err != nil {
		return nil, err
	}
	tok, exp, err := e.sshKeys.Mint(ctx, req.SandboxID, req.Root, ttl)
	if err != nil {
		return nil, err
	}
	ep, err := e.SSHEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	user := req.SandboxID
	if req.Root {
		user += "+root"
	}
	return &apitypes.SSHToken{Token: tok, ExpiresAt: exp, User: user, SSHEndpoint: *ep}, nil
}

// SSHKeyOwner is whom a public key logs in as.
func (e *Engine) SSHKeyOwner(ctx context.Context, pub ssh.PublicKey) (principal.Principal, error) {
	return e.sshKeys.Owner(ctx, pub)
}

// SSHRedeemToken spends a token for a login to sandboxID.
func (e *Engine) SSHRedeemToken(tok, sandboxID string, root bool) (principal.Principal, error) {
	return e.sshKeys.Redeem(tok, sandboxID, root)
}

// SSHAccess says why an SSH login to sandbox id cannot be served, or nil:
// the sandbox must be live and run our agent (sessions are its PTY jobs; a
// qemu-ga guest has none). A login as root is checked where the session
// starts: sandbox.Manager refuses uid 0 outside root mode.
// Ownership is the sandbox service's: it refuses a principal another
// tenant's sandbox as it does for every front end.
func (e *Engine) SSHAccess(ctx context.Context, id string) error {
	if err := checkSandboxID(id); err != nil {
		return err
	}
	d, err := e.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if d.State == apitypes.StateTerminated || d.State == apitypes.StateFailed {
		return errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, d.State)
	}
	caps, err := e.sandboxes.Capabilities(ctx, id)
	if err != nil {
		return err
	}
	if caps.GuestAgent && !caps.Agent {
		return errdefs.Unavailablef("sandbox_id: sandbox %s is a VM reached through the QEMU guest agent, which cannot serve SSH "+
			"(no terminals, file listing or ports); use exec_command and the file tools", id)
	}
	if err := e.sandboxes.Require(ctx, id, sandbox.CapPTY); err != nil {
		return err
	}
	return nil
}

// StatFile describes a path in a sandbox without following a final
// symlink.
func (e *Engine) StatFile(ctx context.Context, id, p string) (*apitypes.FileEntry, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	fi, err := e.sandboxes.StatFile(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return &apitypes.FileEntry{Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fi.Mode, MTime: fi.MTime}, nil
}

// DialPort opens a TCP connection to port on a sandbox's loopback through
// its agent (ssh -L); unlike DialExposed it needs no exposure, because the
// caller has already logged in to the sandbox.
func (e *Engine) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalidf("port: must be 1-65535, got %d", port)
	}
	return e.sandboxes.DialPort(ctx, id, port)
}

func sshAuthorizedKey(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}
