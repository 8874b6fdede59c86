package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RunRecord is the index row of one run record (pkg/runs owns the
// directory it describes).
type RunRecord struct {
	ID          string
	Kind        string // run | autofix
	Language    string
	SandboxID   string
	Image       string
	StartedAt   time.Time
	EndedAt     time.Time
	DurationMS  int64
	ExitCode    int
	Success     bool
	Termination string // the termination cause
	SizeBytes   int64
	Metadata    json.RawMessage // metadata.json, verbatim
}

// RunFilter selects runs for ListRuns; zero fields select everything.
type RunFilter struct {
	Language string
	Success  *bool
	Kind     string
	Limit    int // 0: no limit
}

const runColumns = `id, kind, language, sandbox_id, image, started_at, ended_at, duration_ms, exit_code,
	success, termination, size_bytes, metadata`

// PutRun inserts or replaces the row of run r.ID.
func (s *Store) PutRun(ctx context.Context, r *RunRecord) error {
	if r.ID == "" {
		return errors.New("store: put run: id is required")
	}
	if r.Metadata != nil && !json.Valid(r.Metadata) {
		return fmt.Errorf("store: put run %s: metadata is not valid JSON", r.ID)
	}
	if r.Kind == "" {
		r.Kind = "run"
	}
	var meta any
	if r.Metadata != nil {
		meta = string(r.Metadata)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO runs (`+runColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.Kind, r.Language, r.SandboxID, r.Image, nanos(r.StartedAt), nanos(r.EndedAt), r.DurationMS,
			r.ExitCode, r.Success, r.Termination, r.SizeBytes, meta)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put run %s: %w", r.ID, err)
	}
	return nil
}

// GetRun returns run id, or an error wrapping ErrNotFound.
func (s *Store) GetRun(ctx context.Context, id string) (*RunRecord, error) {
	r, err := scanRun(s.r.QueryRowContext(ctx, "SELECT "+runColumns+" FROM runs WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get run %s: %w", id, err)
	}
	return r, nil
}

// ListRuns returns the runs f selects, newest first.
func (s *Store) ListRuns(ctx context.Context, f RunFilter) ([]*RunRecord, error) {
	var (
		conds []string
		args  []any
	)
	if f.Language != "" {
		conds, args = append(conds, "language = ?"), append(args, f.Language)
	}
	if f.Success != nil {
		conds, args = append(conds, "success = ?"), append(args, *f.Success)
	}
	if f.Kind != "" {
		conds, args = append(conds, "kind = ?"), append(args, f.Kind)
	}
	q := "SELECT " + runColumns + " FROM runs"
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	q += " ORDER BY started_at DESC, id DESC"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	return queryAll(ctx, s.r, "list runs", scanRun, q, args...)
}

// RunSizes returns every run's id, start time and size, oldest first: what
// retention needs to choose what to delete.
func (s *Store) RunSizes(ctx context.Context) ([]RunSize, error) {
	return queryAll(ctx, s.r, "run sizes", func(row rowScanner) (RunSize, error) {
		var (
			r       RunSize
			started int64
		)
		err := row.Scan(&r.ID, &started, &r.SizeBytes)
		r.StartedAt = fromNanos(started)
		return r, err
	}, "SELECT id, started_at, size_bytes FROM runs ORDER BY started_at, id")
}

// RunSize is one row of RunSizes.
type RunSize struct {
	ID        string
	StartedAt time.Time
	SizeBytes int64
}

// DeleteRun deletes run id's row; deleting a missing row is not an error.
func (s *Store) DeleteRun(ctx context.Context, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM runs WHERE id = ?", id)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: delete run %s: %w", id, err)
	}
	return nil
}

func scanRun(row rowScanner) (*RunRecord, error) {
	var (
		r              RunRecord
		started, ended int64
		meta           []byte
	)
	if err := row.Scan(&r.ID, &r.Kind, &r.Language, &r.SandboxID, &r.Image, &started, &ended, &r.DurationMS,
		&r.ExitCode, &r.Success, &r.Termination, &r.SizeBytes, &meta); err != nil {
		return nil, err
	}
	r.StartedAt, r.EndedAt = fromNanos(started), fromNanos(ended)
	if meta != nil {
		r.Metadata = json.RawMessage(meta)
	}
	return &r, nil
}
