package sshkeys

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

func newService(t *testing.T) *Service {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st)
}

func edKey(t *testing.T) (ssh.PublicKey, string) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " me@laptop"
}

func TestKeys(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	pub, line := edKey(t)
	k, err := s.Add(ctx, apitypes.SSHKeyAddRequest{Name: "laptop", PublicKey: line + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	if k.Fingerprint != ssh.FingerprintSHA256(pub) || k.Type != "ssh-ed25519" || !strings.HasPrefix(k.ID, "sk-") || k.Tenant != "" {
		t.Errorf("added %+v", k)
	}
	if _, err := s.Add(ctx, apitypes.SSHKeyAddRequest{Name: "again", PublicKey: line}); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("second registration of one key: %v, want conflict", err)
	}
	who, err := s.Owner(ctx, pub)
	if err != nil || !who.Admin || who.KeyID != k.ID || who.KeyName != "ssh:laptop" {
		t.Errorf("Owner = %+v, %v", who, err)
	}
	other, _ := edKey(t)
	if _, err := s.Owner(ctx, other); !errdefs.Is(err, errdefs.Unauthenticated) {
		t.Errorf("Owner of an unregistered key: %v", err)
	}

	// A tenant sees and removes only its own keys; its key logs in as it.
	tctx := principal.With(ctx, principal.Principal{KeyID: "k-a", Tenant: "t-a"})
	tpub, tline := edKey(t)
	tk, err := s.Add(tctx, apitypes.SSHKeyAddRequest{Name: "tenant key", PublicKey: tline})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.List(tctx); err != nil || len(l.Keys) != 1 || l.Keys[0].ID != tk.ID {
		t.Errorf("tenant's list = %+v, %v", l, err)
	}
	if l, err := s.List(ctx); err != nil || len(l.Keys) != 2 {
		t.Errorf("admin's list = %+v, %v", l, err)
	}
	if who, err := s.Owner(ctx, tpub); err != nil || who.Admin || who.Tenant != "t-a" {
		t.Errorf("tenant key logs in as %+v, %v", who, err)
	}
	if err := s.Remove(tctx, k.ID); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("a tenant removed the admin's key: %v", err)
	}
	if err := s.Remove(ctx, k.Fingerprint); err != nil {
		t.Errorf("remove by fingerprint: %v", err)
	}
	if _, err := s.Owner(ctx, pub); err == nil {
		t.Error("a removed key still logs in")
	}
	if err := s.Remove(ctx, k.ID); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("second remove: %v", err)
	}
}

func TestAddRefuses(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	_, line := edKey(t)
	_, line2 := edKey(t)
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rpub, _ := ssh.NewPublicKey(&rk.PublicKey)
	short := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(rpub)))
	for _, tc := range []struct {
		name string
		req  apitypes.SSHKeyAddRequest
		want string
	}{
		{"no name", apitypes.SSHKeyAddRequest{PublicKey: line}, "name: required"},
		{"control character", apitypes.SSHKeyAddRequest{Name: "a\x1b[2J", PublicKey: line}, "name: holds a control character"},
		{"long name", apitypes.SSHKeyAddRequest{Name: strings.Repeat("n", 65), PublicKey: line}, "name: longer than 64"},
		{"no key", apitypes.SSHKeyAddRequest{Name: "x"}, "public_key: required"},
		{"garbage", apitypes.SSHKeyAddRequest{Name: "x", PublicKey: "ssh-ed25519 !!!"}, "public_key: not an OpenSSH public key"},
		{"two keys", apitypes.SSHKeyAddRequest{Name: "x", PublicKey: line + "\n" + line2}, "public_key: one key per request"},
		{"options", apitypes.SSHKeyAddRequest{Name: "x", PublicKey: `command="/bin/sh" ` + line}, "options"},
		{"short RSA", apitypes.SSHKeyAddRequest{Name: "x", PublicKey: short}, "RSA key of 1024 bits"},
		{"huge", apitypes.SSHKeyAddRequest{Name: "x", PublicKey: "ssh-ed25519 " + strings.Repeat("A", 20<<10)}, "longer than 16 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Add(ctx, tc.req)
			if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Add = %v, want invalid_argument with %q", err, tc.want)
			}
		})
	}
	// A caller that is neither the administrator nor a tenant's would
	// register a key that logs in as the administrator.
	nobody := principal.With(ctx, principal.Principal{KeyID: "k-x"})
	if _, err := s.Add(nobody, apitypes.SSHKeyAddRequest{Name: "x", PublicKey: line}); !errdefs.Is(err, errdefs.PermissionDenied) {
		t.Errorf("Add by a principal of no tenant: %v, want permission_denied", err)
	}
	if l, _ := s.List(ctx); len(l.Keys) != 0 {
		t.Errorf("refused keys were stored: %+v", l.Keys)
	}
}

func TestTokens(t *testing.T) {
	s := newService(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	ctx := principal.With(context.Background(), principal.Principal{KeyID: "k1", KeyName: "ci", Admin: true})
	tok, exp, err := s.Mint(ctx, "sb-1", false, 5*time.Minute)
	if err != nil || !exp.Equal(now.Add(5*time.Minute)) || !strings.HasPrefix(tok, "sbt_") {
		t.Fatalf("Mint = %q, %v, %v", tok, exp, err)
	}
	// Bound to its sandbox and user: a wrong one burns it.
	if _, err := s.Redeem(tok, "sb-2", false); !errdefs.Is(err, errdefs.Unauthenticated) {
		t.Errorf("redeemed for another sandbox: %v", err)
	}
	if _, err := s.Redeem(tok, "sb-1", false); err == nil {
		t.Error("a token survived a failed redeem")
	}
	tok, _, _ = s.Mint(ctx, "sb-1", false, 5*time.Minute)
	if _, err := s.Redeem(tok, "sb-1", true); err == nil {
		t.Error("a user token logged in as root")
	}
	// Single use, and it logs in as whoever minted it.
	tok, _, _ = s.Mint(ctx, "sb-1", true, 5*time.Minute)
	who, err := s.Redeem(tok, "sb-1", true)
	if err != nil || who.KeyID != "k1" {
		t.Errorf("Redeem = %+v, %v", who, err)
	}
	if _, err := s.Redeem(tok, "sb-1", true); !errdefs.Is(err, errdefs.Unauthenticated) || !strings.Contains(err.Error(), "already used") {
		t.Errorf("second use: %v", err)
	}
	// Expiry.
	tok, _, _ = s.Mint(ctx, "sb-1", false, time.Minute)
	now = now.Add(61 * time.Second)
	if _, err := s.Redeem(tok, "sb-1", false); !errdefs.Is(err, errdefs.Unauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
	if _, err := s.Redeem("", "sb-1", false); err == nil {
		t.Error("the empty token logged in")
	}
}

func TestHostKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ssh_host_ed25519_key")
	a, err := HostKey(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host key file: %v, %v", fi, err)
	}
	b, err := HostKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if ssh.FingerprintSHA256(a.PublicKey()) != ssh.FingerprintSHA256(b.PublicKey()) || a.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Error("the host key changed between loads")
	}
	if err := os.WriteFile(p, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := HostKey(p); err == nil {
		t.Error("a corrupt host key was accepted")
	}
}
