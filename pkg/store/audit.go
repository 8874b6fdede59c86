package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// AuditCheckpoint is a row of audit_checkpoints: an audit record's
// sequence number and hash (pkg/audit).
type AuditCheckpoint struct {
	Seq  uint64
	Hash string
	At   time.Time
}

// SaveAuditCheckpoint stores c (again: the same seq replaces its row).
func (s *Store) SaveAuditCheckpoint(ctx context.Context, c AuditCheckpoint) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO audit_checkpoints (seq, hash, at) VALUES (?, ?, ?)`,
			int64(c.Seq), c.Hash, nanos(c.At)); err != nil {
			return fmt.Errorf("save audit checkpoint: %w", err)
		}
		return nil
	})
}

// AuditCheckpoints lists the checkpoints, oldest first.
func (s *Store) AuditCheckpoints(ctx context.Context) ([]AuditCheckpoint, error) {
	return queryAll(ctx, s.r, "audit checkpoints", func(r rowScanner) (AuditCheckpoint, error) {
		var c AuditCheckpoint
		var seq, at int64
		err := r.Scan(&seq, &c.Hash, &at)
		c.Seq, c.At = uint64(seq), fromNanos(at)
		return c, err
	}, `SELECT seq, hash, at FROM audit_checkpoints ORDER BY seq`)
}

// DeleteAuditCheckpointsBefore deletes the checkpoints of records below seq
// (audit retention removed them).
func (s *Store) DeleteAuditCheckpointsBefore(ctx context.Context, seq uint64) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM audit_checkpoints WHERE seq < ?`, int64(seq)); err != nil {
			return fmt.Errorf("delete audit checkpoints: %w", err)
		}
		return nil
	})
}
