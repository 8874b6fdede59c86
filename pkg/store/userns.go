package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrNoIDRange is returned by AcquireIDRange when every slot is taken.
var ErrNoIDRange = errors.New("every user namespace id range is in use")

// AcquireIDRange returns the slot of the id range held by sandboxID,
// taking the lowest free slot below count first if it holds none. The read
// and the insert share one write transaction, so two sandboxes are never
// handed the same slot, and a sandbox asking again keeps its own.
func (s *Store) AcquireIDRange(ctx context.Context, sandboxID string, count int) (int, error) {
	slot := -1
	err := s.write(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, "SELECT slot FROM userns_ranges WHERE sandbox_id = ?", sandboxID).Scan(&slot)
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// The lowest free slot: 0 if free, else the first n+1 not taken.
		err = tx.QueryRowContext(ctx, `SELECT MIN(s) FROM (
	SELECT 0 AS s WHERE NOT EXISTS (SELECT 1 FROM userns_ranges WHERE slot = 0)
	UNION ALL
	SELECT slot + 1 FROM userns_ranges r WHERE NOT EXISTS (SELECT 1 FROM userns_ranges WHERE slot = r.slot + 1))`).Scan(&slot)
		if err != nil {
			return err
		}
		if slot < 0 || slot >= count {
			return ErrNoIDRange
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO userns_ranges (slot, sandbox_id, acquired_at) VALUES (?, ?, ?)",
			slot, sandboxID, nanos(time.Now()))
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("store: acquire user namespace range for %s: %w", sandboxID, err)
	}
	return slot, nil
}

// ReleaseIDRange frees sandboxID's range; releasing one that is not held is
// not an error, so release can be repeated after a crash.
func (s *Store) ReleaseIDRange(ctx context.Context, sandboxID string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM userns_ranges WHERE sandbox_id = ?", sandboxID)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: release user namespace range of %s: %w", sandboxID, err)
	}
	return nil
}

// IDRanges returns every held range: sandbox id → slot.
func (s *Store) IDRanges(ctx context.Context) (map[string]int, error) {
	type row struct {
		id   string
		slot int
	}
	rows, err := queryAll(ctx, s.r, "list user namespace ranges", func(r rowScanner) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.slot)
		return x, err
	}, "SELECT sandbox_id, slot FROM userns_ranges ORDER BY slot")
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(rows))
	for _, x := range rows {
		out[x.id] = x.slot
	}
	return out, nil
}
