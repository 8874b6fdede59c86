package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SSHKey is a public key registered for SSH access (pkg/services/sshkeys).
type SSHKey struct {
	ID          string
	Name        string
	Tenant      string
	Fingerprint string
	// PublicKey is the key in authorized_keys form ("ssh-ed25519 AAAA...").
	PublicKey string
	CreatedAt time.Time
}

// ErrDuplicate is returned when a unique column already holds the value.
var ErrDuplicate = errors.New("already exists")

// PutSSHKey records a new key; a key whose fingerprint is already
// registered is an error wrapping ErrDuplicate.
func (s *Store) PutSSHKey(ctx context.Context, k SSHKey) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ssh_keys (id, name, tenant, fingerprint, public_key, created_at) VALUES (?, ?, ?, ?, ?, ?)",
			k.ID, k.Name, k.Tenant, k.Fingerprint, k.PublicKey, nanos(k.CreatedAt))
		if err != nil && strings.Contains(err.Error(), "UNIQUE") {
			return ErrDuplicate
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: record ssh key %s: %w", k.Fingerprint, err)
	}
	return nil
}

// DeleteSSHKey removes key id; a missing row is ErrNotFound.
func (s *Store) DeleteSSHKey(ctx context.Context, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM ssh_keys WHERE id = ?", id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: delete ssh key %s: %w", id, err)
	}
	return nil
}

// ListSSHKeys lists every registered key, oldest first.
func (s *Store) ListSSHKeys(ctx context.Context) ([]SSHKey, error) {
	return queryAll(ctx, s.r, "list ssh keys", scanSSHKey,
		"SELECT id, name, tenant, fingerprint, public_key, created_at FROM ssh_keys ORDER BY created_at, id")
}

// SSHKeyByFingerprint returns the key with fingerprint, or an error
// wrapping ErrNotFound.
func (s *Store) SSHKeyByFingerprint(ctx context.Context, fingerprint string) (*SSHKey, error) {
	k, err := scanSSHKey(s.r.QueryRowContext(ctx,
		"SELECT id, name, tenant, fingerprint, public_key, created_at FROM ssh_keys WHERE fingerprint = ?", fingerprint))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: ssh key %s: %w", fingerprint, err)
	}
	return &k, nil
}

func scanSSHKey(r rowScanner) (SSHKey, error) {
	var k SSHKey
	var at int64
	err := r.Scan(&k.ID, &k.Name, &k.Tenant, &k.Fingerprint, &k.PublicKey, &at)
	k.CreatedAt = fromNanos(at)
	return k, err
}
