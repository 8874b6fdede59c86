package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// PortExposure is a sandbox port served by the preview listener.
type PortExposure struct {
	SandboxID string
	Port      int
	Token     string
	CreatedAt time.Time
	// KeyID is the API key that made the exposure ("" for the socket).
	KeyID string
}

// PutPortExposure records an exposure (replacing one of the same port).
func (s *Store) PutPortExposure(ctx context.Context, x PortExposure) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT OR REPLACE INTO port_exposures (sandbox_id, port, token, created_at, key_id) VALUES (?, ?, ?, ?, ?)",
			x.SandboxID, x.Port, x.Token, nanos(x.CreatedAt), x.KeyID)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: record exposure of port %d of %s: %w", x.Port, x.SandboxID, err)
	}
	return nil
}

// DeletePortExposures removes the exposures of sandboxID: of port, or all
// of them when port is 0.
func (s *Store) DeletePortExposures(ctx context.Context, sandboxID string, port int) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		if port == 0 {
			_, err = tx.ExecContext(ctx, "DELETE FROM port_exposures WHERE sandbox_id = ?", sandboxID)
		} else {
			_, err = tx.ExecContext(ctx, "DELETE FROM port_exposures WHERE sandbox_id = ? AND port = ?", sandboxID, port)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: delete exposures of %s: %w", sandboxID, err)
	}
	return nil
}

// ListPortExposures lists every recorded exposure.
func (s *Store) ListPortExposures(ctx context.Context) ([]PortExposure, error) {
	return queryAll(ctx, s.r, "list port exposures", func(r rowScanner) (PortExposure, error) {
		var x PortExposure
		var at int64
		err := r.Scan(&x.SandboxID, &x.Port, &x.Token, &at, &x.KeyID)
		x.CreatedAt = fromNanos(at)
		return x, err
	}, "SELECT sandbox_id, port, token, created_at, key_id FROM port_exposures ORDER BY sandbox_id, port")
}
