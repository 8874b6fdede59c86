package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SnapshotRecord is the row of one workspace snapshot; the archive itself
// is a file the engine owns.
type SnapshotRecord struct {
	ID           string
	Name         string
	SandboxID    string
	Language     string
	Image        string
	ImageDigest  string
	DiskBacking  string
	SizeBytes    int64
	ContentBytes int64
	CreatedAt    time.Time
	// ExcludedVolumes are "name:/path" of the named volumes the sandbox
	// had mounted, whose files the archive does not hold.
	ExcludedVolumes []string
}

const snapshotColumns = `id, name, sandbox_id, language, image, image_digest, disk_backing, size_bytes, content_bytes, created_at, excluded_volumes`

// InsertSnapshot records snapshot r. A snapshot with the same id (the same
// archive bytes) exists already: ErrExists is returned and nothing changes.
func (s *Store) InsertSnapshot(ctx context.Context, r *SnapshotRecord) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
			r.ID, r.Name, r.SandboxID, r.Language, r.Image, r.ImageDigest, r.DiskBacking, r.SizeBytes, r.ContentBytes, nanos(r.CreatedAt),
			strings.Join(r.ExcludedVolumes, "\n"))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrExists
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrExists) {
		return fmt.Errorf("store: insert snapshot %s: %w", r.ID, err)
	}
	return err
}

// ErrExists is returned when a row with the same key exists.
var ErrExists = errors.New("exists")

func scanSnapshot(r rowScanner) (*SnapshotRecord, error) {
	var (
		s        SnapshotRecord
		created  int64
		excluded string
	)
	if err := r.Scan(&s.ID, &s.Name, &s.SandboxID, &s.Language, &s.Image, &s.ImageDigest, &s.DiskBacking, &s.SizeBytes, &s.ContentBytes, &created, &excluded); err != nil {
		return nil, err
	}
	if excluded != "" {
		s.ExcludedVolumes = strings.Split(excluded, "\n")
	}
	s.CreatedAt = fromNanos(created)
	return &s, nil
}

// GetSnapshot returns snapshot id, or an error wrapping ErrNotFound.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*SnapshotRecord, error) {
	r, err := scanSnapshot(s.r.QueryRowContext(ctx, "SELECT "+snapshotColumns+" FROM snapshots WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get snapshot %s: %w", id, err)
	}
	return r, nil
}

// ListSnapshots lists the snapshots of sandboxID (all when empty), newest
// first.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID string) ([]*SnapshotRecord, error) {
	if sandboxID == "" {
		return queryAll(ctx, s.r, "list snapshots", scanSnapshot, "SELECT "+snapshotColumns+" FROM snapshots ORDER BY created_at DESC, id")
	}
	return queryAll(ctx, s.r, "list snapshots", scanSnapshot,
		"SELECT "+snapshotColumns+" FROM snapshots WHERE sandbox_id = ? ORDER BY created_at DESC, id", sandboxID)
}

// SnapshotsBefore lists the snapshots created before t, oldest first.
func (s *Store) SnapshotsBefore(ctx context.Context, t time.Time) ([]*SnapshotRecord, error) {
	return queryAll(ctx, s.r, "list old snapshots", scanSnapshot,
		"SELECT "+snapshotColumns+" FROM snapshots WHERE created_at < ? ORDER BY created_at", nanos(t))
}

// DeleteSnapshot deletes snapshot id's row; a missing row is ErrNotFound.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM snapshots WHERE id = ?", id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrNotFound
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("store: delete snapshot %s: %w", id, err)
	}
	return err
}
