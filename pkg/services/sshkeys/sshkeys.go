// Package sshkeys is the SSH identity service: the public keys registered
// for SSH access (in SQLite, table ssh_keys), the short-lived single-use
// tokens `sandboxctl ssh` logs in with (in memory), and the endpoint's host
// key (generated once in the state directory). The SSH front end (pkg/sshd)
// asks it who a key or token belongs to; the REST front end manages keys
// and mints tokens through the engine's one-line delegations.
package sshkeys

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Store is what the service needs of the state database: its own table.
type Store interface {
	PutSSHKey(ctx context.Context, k store.SSHKey) error
	DeleteSSHKey(ctx context.Context, id string) error
	ListSSHKeys(ctx context.Context) ([]store.SSHKey, error)
	SSHKeyByFingerprint(ctx context.Context, fingerprint string) (*store.SSHKey, error)
}

// Service owns SSH identities. Security boundary: a key is registered for
// the principal that added it (its tenant, or the administrator), and a
// login by key acts as that owner and nobody else; a token is bound to one
// sandbox and one user (root or not), is compared in constant time, dies at
// its first use and at its expiry, and is never stored: only its SHA-256 is
// kept, in memory, so a restart voids every outstanding token.
type Service struct {
	store Store
	now   func() time.Time

	mu     sync.Mutex
	tokens map[[32]byte]token
}

type token struct {
	sandboxID string
	root      bool
	owner     principal.Principal
	expires   time.Time
}

// New returns the service over st.
func New(st Store) *Service {
	return &Service{store: st, now: time.Now, tokens: map[[32]byte]token{}}
}

// weakKey says why a key is refused, or "": DSA and short RSA keys are
// what OpenSSH itself no longer accepts.
func weakKey(pub ssh.PublicKey) string {
	switch pub.Type() {
	case "ssh-dss": // ssh.KeyAlgoDSA, deprecated by x/crypto for this very reason
		return "DSA keys are refused (OpenSSH dropped them); use ed25519"
	case ssh.KeyAlgoRSA:
		if ck, ok := pub.(ssh.CryptoPublicKey); ok {
			if rk, ok := ck.CryptoPublicKey().(interface{ Size() int }); ok && rk.Size()*8 < 2048 {
				return fmt.Sprintf("an RSA key of %d bits is too short (at least 2048)", rk.Size()*8)
			}
		}
	}
	return ""
}

// checkName validates a key's label.
func checkName(name string) error {
	if name == "" {
		return errdefs.Invalidf("name: required")
	}
	if len(name) > 64 {
		return errdefs.Invalidf("name: longer than 64 bytes")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return errdefs.Invalidf("name: holds a control character")
		}
	}
	return nil
}

// owner is the principal ctx carries; engine-internal calls (none carry
// one) act as the administrator.
func owner(ctx context.Context) principal.Principal {
	p, ok := principal.From(ctx)
	if !ok {
		return principal.Principal{KeyName: "engine", Admin: true}
	}
	return p
}

// Add registers a public key for the calling principal.
func (s *Service) Add(ctx context.Context, req apitypes.SSHKeyAddRequest) (*apitypes.SSHKey, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	line := strings.TrimSpace(req.PublicKey)
	if line == "" {
		return nil, errdefs.Invalidf("public_key: required")
	}
	if len(line) > 16<<10 {
		return nil, errdefs.Invalidf("public_key: longer than 16 KiB")
	}
	if strings.ContainsAny(line, "\n\r") {
		return nil, errdefs.Invalidf("public_key: one key per request (one line of authorized_keys form)")
	}
	pub, _, options, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, errdefs.Invalidf("public_key: not an OpenSSH public key (%v)", err)
	}
	if len(options) > 0 {
		return nil, errdefs.Invalidf("public_key: authorized_keys options (%s) are not supported", strings.Join(options, ","))
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return nil, errdefs.Invalidf("public_key: certificates are not supported; register the plain key")
	}
	if why := weakKey(pub); why != "" {
		return nil, errdefs.Invalidf("public_key: %s", why)
	}
	id, err := randomHex(8)
	if err != nil {
		return nil, err
	}
	p := owner(ctx)
	if !p.Admin && p.Tenant == "" {
		// A key of no tenant logs in as the administrator (Owner): only
		// the administrator may make one.
		return nil, errdefs.PermissionDeniedf("public_key: a caller of no tenant that is not the administrator cannot register SSH keys")
	}
	k := store.SSHKey{ID: "sk-" + id, Name: req.Name, Tenant: p.Tenant, Fingerprint: ssh.FingerprintSHA256(pub),
		PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), CreatedAt: s.now().UTC()}
	if err := s.store.PutSSHKey(ctx, k); err != nil {
		if errors.Is(err, store.ErrDuplicate) {
			return nil, errdefs.Conflictf("public_key: %s is already registered", k.Fingerprint)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "record ssh key")
	}
	return toAPI(k), nil
}

func toAPI(k store.SSHKey) *apitypes.SSHKey {
	typ, _, _ := strings.Cut(k.PublicKey, " ")
	return &apitypes.SSHKey{ID: k.ID, Name: k.Name, Type: typ, Fingerprint: k.Fingerprint, Tenant: k.Tenant, CreatedAt: k.CreatedAt}
}

// visible says whether p may see and remove k: the administrator sees
// every key, a tenant its own.
func visible(p principal.Principal, k store.SSHKey) bool {
	return p.Admin || k.Tenant == p.Tenant
}

// List lists the keys the calling principal may see.
func (s *Service) List(ctx context.Context) (*apitypes.SSHKeyList, error) {
	all, err := s.store.ListSSHKeys(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list ssh keys")
	}
	p := owner(ctx)
	out := &apitypes.SSHKeyList{Keys: []apitypes.SSHKey{}}
	for _, k := range all {
		if visible(p, k) {
			out.Keys = append(out.Keys, *toAPI(k))
		}
	}
	return out, nil
}

// Remove deletes key id (an id from List, or a fingerprint).
func (s *Service) Remove(ctx context.Context, id string) error {
	if id == "" {
		return errdefs.Invalidf("id: required")
	}
	all, err := s.store.ListSSHKeys(ctx)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "list ssh keys")
	}
	p := owner(ctx)
	for _, k := range all {
		if (k.ID == id || k.Fingerprint == id) && visible(p, k) {
			if err := s.store.DeleteSSHKey(ctx, k.ID); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "delete ssh key")
			}
			return nil
		}
	}
	return errdefs.NotFoundf("id: no ssh key %q", id)
}

// Owner returns the principal a public key logs in as: the owner it was
// registered for. An unknown key is not_found.
func (s *Service) Owner(ctx context.Context, pub ssh.PublicKey) (principal.Principal, error) {
	k, err := s.store.SSHKeyByFingerprint(ctx, ssh.FingerprintSHA256(pub))
	if errors.Is(err, store.ErrNotFound) {
		return principal.Principal{}, errdefs.Unauthenticatedf("public key %s is not registered", ssh.FingerprintSHA256(pub))
	}
	if err != nil {
		return principal.Principal{}, errdefs.Wrap(errdefs.Internal, err, "look up ssh key")
	}
	// Until tenants exist every key belongs to the administrator; a
	// tenant's key acts only within its tenant.
	return principal.Principal{KeyID: k.ID, KeyName: "ssh:" + k.Name, Tenant: k.Tenant, Admin: k.Tenant == ""}, nil
}

// Mint makes a token for one login to sandboxID (as root when root) valid
// for ttl. The caller has checked that the sandbox exists and that the
// calling principal may reach it.
func (s *Service) Mint(ctx context.Context, sandboxID string, root bool, ttl time.Duration) (string, time.Time, error) {
	raw, err := randomBytes(32)
	if err != nil {
		return "", time.Time{}, err
	}
	tok := "sbt_" + base64.RawURLEncoding.EncodeToString(raw)
	exp := s.now().Add(ttl).UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for h, t := range s.tokens {
		if now.After(t.expires) {
			delete(s.tokens, h)
		}
	}
	if len(s.tokens) >= maxTokens {
		return "", time.Time{}, errdefs.LimitExceededf("ssh tokens: %d are outstanding; wait for some to expire", maxTokens)
	}
	s.tokens[sha256.Sum256([]byte(tok))] = token{sandboxID: sandboxID, root: root, owner: owner(ctx), expires: exp}
	return tok, exp, nil
}

// maxTokens bounds the outstanding tokens a client can make the daemon hold.
const maxTokens = 10_000

// Redeem spends tok for a login to sandboxID (as root when root) and
// returns whom it logs in as. A token is single-use: it is gone after this
// call whatever the outcome, so a guess against the right token burns it.
func (s *Service) Redeem(tok, sandboxID string, root bool) (principal.Principal, error) {
	h := sha256.Sum256([]byte(tok))
	s.mu.Lock()
	t, ok := s.tokens[h]
	delete(s.tokens, h)
	s.mu.Unlock()
	switch {
	case !ok:
		return principal.Principal{}, errdefs.Unauthenticatedf("token: unknown, already used or expired")
	case s.now().After(t.expires):
		return principal.Principal{}, errdefs.Unauthenticatedf("token: expired at %s", t.expires.Format(time.RFC3339))
	case subtle.ConstantTimeCompare([]byte(t.sandboxID), []byte(sandboxID)) != 1 || t.root != root:
		return principal.Principal{}, errdefs.Unauthenticatedf("token: minted for another sandbox or user")
	}
	return t.owner, nil
}

// HostKey loads the endpoint's host key from path, generating an ed25519
// key there (mode 0600) the first time, so clients see one key for the
// life of the state directory.
func HostKey(path string) (ssh.Signer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("generate ssh host key: %w", gerr)
		}
		block, merr := ssh.MarshalPrivateKey(priv, "mcp-sandboxd host key")
		if merr != nil {
			return nil, fmt.Errorf("encode ssh host key: %w", merr)
		}
		data = pem.EncodeToMemory(block)
		// O_EXCL: two daemons never share a state directory (its lock),
		// but a half-written key must never be read as a whole one.
		tmp := path + ".tmp"
		if werr := os.WriteFile(tmp, data, 0o600); werr != nil {
			return nil, fmt.Errorf("write ssh host key: %w", werr)
		}
		if rerr := os.Rename(tmp, path); rerr != nil {
			return nil, fmt.Errorf("write ssh host key: %w", rerr)
		}
	} else if err != nil {
		return nil, fmt.Errorf("read ssh host key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: %w", path, err)
	}
	return signer, nil
}

func randomBytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "random bytes")
	}
	return b, nil
}

func randomHex(n int) (string, error) {
	b, err := randomBytes(n)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
