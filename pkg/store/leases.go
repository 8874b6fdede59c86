package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Lease is one network address held by a sandbox.
type Lease struct {
	SandboxID  string
	IP         string
	AcquiredAt time.Time
}

// AcquireLease returns the address leased to sandboxID, leasing one first if
// it has none: pick is called with the addresses in use and returns a free
// one. The read and the insert share one write transaction, so two callers
// can never be handed the same address, and a sandbox keeps its address
// when asked again (a daemon adopting it after a restart).
func (s *Store) AcquireLease(ctx context.Context, sandboxID string, pick func(used map[string]bool) (string, error)) (string, error) {
	var ip string
	err := s.write(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, "SELECT ip FROM network_leases WHERE sandbox_id = ?", sandboxID).Scan(&ip)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT ip FROM network_leases")
		if err != nil {
			return err
		}
		used := map[string]bool{}
		for rows.Next() {
			var u string
			if err := rows.Scan(&u); err != nil {
				rows.Close()
				return err
			}
			used[u] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if ip, err = pick(used); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO network_leases (ip, sandbox_id, acquired_at) VALUES (?, ?, ?)",
			ip, sandboxID, nanos(time.Now()))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("store: acquire lease for %s: %w", sandboxID, err)
	}
	return ip, nil
}

// ReleaseLease deletes sandboxID's lease; releasing a lease that is not
// there is not an error, so release can be repeated after a crash.
func (s *Store) ReleaseLease(ctx context.Context, sandboxID string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM network_leases WHERE sandbox_id = ?", sandboxID)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: release lease of %s: %w", sandboxID, err)
	}
	return nil
}

// ListLeases returns every lease, oldest first.
func (s *Store) ListLeases(ctx context.Context) ([]Lease, error) {
	return queryAll(ctx, s.r, "list leases", func(r rowScanner) (Lease, error) {
		var l Lease
		var at int64
		err := r.Scan(&l.SandboxID, &l.IP, &at)
		l.AcquiredAt = fromNanos(at)
		return l, err
	}, "SELECT sandbox_id, ip, acquired_at FROM network_leases ORDER BY acquired_at, ip")
}
