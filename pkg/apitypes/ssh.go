package apitypes

import "time"

// SSHKeyAddRequest registers a public key for SSH access (sandboxctl
// ssh-keys add, POST /v1/ssh/keys).
type SSHKeyAddRequest struct {
	// Name is a label for people ("laptop"); 1-64 printable characters.
	Name string `json:"name"`
	// PublicKey is one line of authorized_keys form
	// ("ssh-ed25519 AAAA... comment").
	PublicKey string `json:"public_key"`
}

// SSHKey is a registered public key.
type SSHKey struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Type is the key's algorithm ("ssh-ed25519", "ssh-rsa", ...).
	Type string `json:"type"`
	// Fingerprint is the SHA256 fingerprint ssh-keygen -l prints.
	Fingerprint string `json:"fingerprint"`
	// Tenant owns the key ("" for the administrator's keys).
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SSHKeyList is GET /v1/ssh/keys.
type SSHKeyList struct {
	Keys []SSHKey `json:"keys"`
}

// SSHTokenRequest mints a token for one SSH login to a sandbox (sandboxctl
// ssh, POST /v1/sandboxes/{id}/ssh-token).
type SSHTokenRequest struct {
	SandboxID string `json:"sandbox_id"`
	// TTLSeconds is how long the token stays valid; 0: ssh.token_ttl.
	TTLSeconds float64 `json:"ttl_seconds,omitempty"`
	// Root logs in as uid 0 (root-mode sandboxes only).
	Root bool `json:"root,omitempty"`
}

// SSHToken is a minted token and what a client needs to use it.
type SSHToken struct {
	// Token is the answer to the endpoint's keyboard-interactive prompt;
	// it is valid for one login, until ExpiresAt.
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	// User is the SSH user name: the sandbox id, with "+root" for Root.
	User string `json:"user"`
	SSHEndpoint
}

// SSHEndpoint is where the SSH endpoint listens and the host key it
// presents (GET /v1/ssh), for known_hosts and ssh-config.
type SSHEndpoint struct {
	// Listen is ssh.listen; empty when the endpoint is off.
	Listen string `json:"listen"`
	// HostKey is the endpoint's public host key in authorized_keys form.
	HostKey string `json:"host_key,omitempty"`
}
