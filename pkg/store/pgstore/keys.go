package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

const keyColumns = `id, name, tenant, admin, hash, quota, created_at, last_used_at, expires_at, revoked_at`

// notifyKeys announces a key change inside tx: PostgreSQL delivers it at
// commit, never for a transaction rolled back.
func notifyKeys(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, KeysChannel, id)
	return err
}

// InsertKey records key r; a key of the same name exists: store.ErrExists.
func (s *Store) InsertKey(ctx context.Context, r *store.KeyRecord) error {
	quota := r.Quota
	if len(quota) == 0 {
		quota = []byte("{}")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			r.ID, r.Name, r.Tenant, r.Admin, r.Hash, string(quota), nanos(r.CreatedAt), nanos(r.LastUsedAt), nanos(r.ExpiresAt), nanos(r.RevokedAt))
		if isUniqueViolation(err) {
			return store.ErrExists
		}
		if err != nil {
			return err
		}
		return notifyKeys(ctx, tx, r.ID)
	})
	if err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("pgstore: insert key %s: %w", r.ID, err)
	}
	return err
}

// ListKeys lists every key, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]*store.KeyRecord, error) {
	rows, err := s.pool.Query(ctx, "SELECT "+keyColumns+" FROM api_keys ORDER BY created_at, id")
	if err != nil {
		return nil, fmt.Errorf("pgstore: list keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*store.KeyRecord, error) {
		var (
			k                               store.KeyRecord
			quota                           string
			created, used, expires, revoked int64
		)
		err := r.Scan(&k.ID, &k.Name, &k.Tenant, &k.Admin, &k.Hash, &quota, &created, &used, &expires, &revoked)
		k.Quota = []byte(quota)
		k.CreatedAt, k.LastUsedAt, k.ExpiresAt, k.RevokedAt = fromNanos(created), fromNanos(used), fromNanos(expires), fromNanos(revoked)
		return &k, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list keys: %w", err)
	}
	return out, nil
}

// RevokeKey marks key id revoked at at; a key revoked already keeps its
// first time. store.ErrNotFound when there is no such key.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	return s.updateKey(ctx, id, "revoke", "UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN $1 ELSE revoked_at END WHERE id = $2", nanos(at), id)
}

// SetKeyHash replaces key id's secret (rotation): the old secret stops
// working in the same transaction.
func (s *Store) SetKeyHash(ctx context.Context, id string, hash []byte) error {
	return s.updateKey(ctx, id, "rotate", "UPDATE api_keys SET hash = $1 WHERE id = $2 AND revoked_at = 0", hash, id)
}

func (s *Store) updateKey(ctx context.Context, id, what, q string, args ...any) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, q, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrNotFound
		}
		return notifyKeys(ctx, tx, id)
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("pgstore: %s key %s: %w", what, id, err)
	}
	return err
}

// TouchKeys records when keys were last used, all in one statement: the
// authenticator batches these (one write per interval, not per request).
// A later time never goes back (GREATEST): gateways flush in any order.
// No notification: last use is not a change other gateways act on.
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	ids := make([]string, 0, len(used))
	ats := make([]int64, 0, len(used))
	for id, at := range used {
		ids = append(ids, id)
		ats = append(ats, nanos(at))
	}
	_, err := s.pool.Exec(ctx, `UPDATE api_keys k SET last_used_at = GREATEST(k.last_used_at, u.at)
		FROM unnest($1::text[], $2::bigint[]) AS u(id, at) WHERE k.id = u.id`, ids, ats)
	if err != nil {
		return fmt.Errorf("pgstore: record key use: %w", err)
	}
	return nil
}

// WatchKeys calls changed after every committed key change made through
// any Store on this database, until ctx ends. It listens on a connection
// of its own, and calls changed once each time it starts listening (at
// first and after a broken connection is replaced): a change committed
// before the LISTEN took effect is then not missed. It returns ctx's error.
func (s *Store) WatchKeys(ctx context.Context, changed func()) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		_ = s.listen(ctx, KeysChannel, func() {
			changed()
			backoff = 100 * time.Millisecond
		}, changed) // a broken connection: retried below
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
	return ctx.Err()
}

func (s *Store) listen(ctx context.Context, channel string, listening, changed func()) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The session LISTENs: it must not go back to the pool for others.
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		changed()
	}
}
