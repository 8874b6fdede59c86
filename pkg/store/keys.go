package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// KeyRecord is the row of one API key. Hash is the SHA-256 of the secret;
// the secret itself is never stored. Quota is JSON the store does not read.
type KeyRecord struct {
	ID         string
	Name       string
	Tenant     string
	Admin      bool
	Hash       []byte
	Quota      []byte
	CreatedAt  time.Time
	LastUsedAt time.Time
	ExpiresAt  time.Time
	RevokedAt  time.Time
}

const keyColumns = `id, name, tenant, admin, hash, quota, created_at, last_used_at, expires_at, revoked_at`

// InsertKey records key r; a key of the same name exists: ErrExists.
func (s *Store) InsertKey(ctx context.Context, r *KeyRecord) error {
	quota := r.Quota
	if len(quota) == 0 {
		quota = []byte("{}")
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.Name, r.Tenant, r.Admin, r.Hash, string(quota), nanos(r.CreatedAt), nanos(r.LastUsedAt), nanos(r.ExpiresAt), nanos(r.RevokedAt))
		if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: api_keys.name") {
			return ErrExists
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrExists) {
		return fmt.Errorf("store: insert key %s: %w", r.ID, err)
	}
	return err
}

// ListKeys lists every key, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]*KeyRecord, error) {
	return queryAll(ctx, s.r, "list keys", func(r rowScanner) (*KeyRecord, error) {
		var (
			k                               KeyRecord
			quota                           string
			created, used, expires, revoked int64
		)
		err := r.Scan(&k.ID, &k.Name, &k.Tenant, &k.Admin, &k.Hash, &quota, &created, &used, &expires, &revoked)
		k.Quota = []byte(quota)
		k.CreatedAt, k.LastUsedAt, k.ExpiresAt, k.RevokedAt = fromNanos(created), fromNanos(used), fromNanos(expires), fromNanos(revoked)
		return &k, err
	}, "SELECT "+keyColumns+" FROM api_keys ORDER BY created_at, id")
}

// RevokeKey marks key id revoked at at; a key revoked already keeps its
// first time. ErrNotFound when there is no such key.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	return s.updateKey(ctx, id, "revoke", "UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN ? ELSE revoked_at END WHERE id = ?", nanos(at), id)
}

// SetKeyHash replaces key id's secret (rotation): the old secret stops
// working in the same transaction.
func (s *Store) SetKeyHash(ctx context.Context, id string, hash []byte) error {
	return s.updateKey(ctx, id, "rotate", "UPDATE api_keys SET hash = ? WHERE id = ? AND revoked_at = 0", hash, id)
}

func (s *Store) updateKey(ctx context.Context, id, what, q string, args ...any) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrNotFound
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("store: %s key %s: %w", what, id, err)
	}
	return err
}

// TouchKeys records when keys were last used, all in one transaction: the
// authenticator batches these (one write per interval, not per request).
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		for id, at := range used {
			if _, err := tx.ExecContext(ctx, "UPDATE api_keys SET last_used_at = MAX(last_used_at, ?) WHERE id = ?", nanos(at), id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: record key use: %w", err)
	}
	return nil
}
