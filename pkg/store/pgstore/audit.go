package pgstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The fleet's audit log is rows of audit_records, one canonical line each
// (the same bytes pkg/audit writes to its files, hash chain included), and
// not files: gateways on several hosts share no file system, and the
// chain needs one order of records across all of them. audit_head holds
// the newest record's seq and hash; an append locks that row, so appends
// from every gateway queue there and each chains to the one before. A
// commit returns after PostgreSQL has made it durable, as Append's fsync
// does for a file.

// AppendAudit chains rec after the newest record and stores it; it
// returns rec with its Seq, Prev and Hash set.
func (s *Store) AppendAudit(ctx context.Context, rec audit.Record) (audit.Record, error) {
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var seq int64
		var prev string
		if err := tx.QueryRow(ctx, `SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE`).Scan(&seq, &prev); err != nil {
			return err
		}
		line, err := rec.Seal(uint64(seq)+1, prev)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO audit_records (seq, line) VALUES ($1, $2)`, int64(rec.Seq), string(line)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1`, int64(rec.Seq), rec.Hash)
		return err
	})
	if err != nil {
		return rec, errdefs.Wrap(errdefs.Internal, err, "append audit record")
	}
	return rec, nil
}

// SaveAuditCheckpoint stores c (again: the same seq replaces its row).
func (s *Store) SaveAuditCheckpoint(ctx context.Context, c audit.Checkpoint) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO audit_checkpoints (seq, hash, at) VALUES ($1, $2, $3)
		ON CONFLICT (seq) DO UPDATE SET hash = EXCLUDED.hash, at = EXCLUDED.at`, int64(c.Seq), c.Hash, nanos(c.At))
	if err != nil {
		return fmt.Errorf("pgstore: save audit checkpoint: %w", err)
	}
	return nil
}

// AuditCheckpoints lists the checkpoints, oldest first.
func (s *Store) AuditCheckpoints(ctx context.Context) ([]audit.Checkpoint, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, hash, at FROM audit_checkpoints ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("pgstore: audit checkpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (audit.Checkpoint, error) {
		var c audit.Checkpoint
		var seq, at int64
		err := r.Scan(&seq, &c.Hash, &at)
		c.Seq, c.At = uint64(seq), fromNanos(at)
		return c, err
	})
}

// DeleteAuditCheckpointsBefore deletes the checkpoints of records below
// seq (retention removed them).
func (s *Store) DeleteAuditCheckpointsBefore(ctx context.Context, seq uint64) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM audit_checkpoints WHERE seq < $1`, int64(seq)); err != nil {
		return fmt.Errorf("pgstore: delete audit checkpoints: %w", err)
	}
	return nil
}

// ExportAudit writes the audit rows, in seq order, to dir as one log file
// of pkg/audit's form, and returns its path: what VerifyAudit checks, and
// what an operator archives. No rows: "" and no file.
func (s *Store) ExportAudit(ctx context.Context, dir string) (string, error) {
	var first int64
	err := s.pool.QueryRow(ctx, `SELECT COALESCE(min(seq), 0) FROM audit_records`).Scan(&first)
	if err != nil || first == 0 {
		return "", err
	}
	path := filepath.Join(dir, audit.FileName(uint64(first)))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	rows, err := s.pool.Query(ctx, `SELECT line FROM audit_records ORDER BY seq`)
	if err != nil {
		return "", err
	}
	var line string
	_, err = pgx.ForEachRow(rows, []any{&line}, func() error {
		_, err := w.WriteString(line + "\n")
		return err
	})
	if err != nil {
		return "", err
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	return path, f.Close()
}

// VerifyAudit checks the fleet's audit log: the hash chain of its rows
// and the checkpoints, with pkg/audit's verifier (the rows are exported to
// a temporary directory first).
func (s *Store) VerifyAudit(ctx context.Context) (*apitypes.AuditReport, error) {
	// Checkpoints first: one taken after the export would name a record
	// the export does not hold.
	cps, err := s.AuditCheckpoints(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sandboxd-audit-verify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path, err := s.ExportAudit(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("pgstore: export audit: %w", err)
	}
	if path == "" {
		rep := &apitypes.AuditReport{OK: len(cps) == 0}
		if len(cps) > 0 {
			rep.Problem = &apitypes.AuditProblem{Kind: audit.Removed, Seq: cps[0].Seq, Message: fmt.Sprintf(
				"the log has no records but the database holds a checkpoint of record %d: the records were removed", cps[len(cps)-1].Seq)}
		}
		return rep, nil
	}
	return audit.VerifyDir(dir, cps)
}
