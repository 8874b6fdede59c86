package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// VolumeRecord is the row of one named volume; its image file, loop
// device and mount are the volume service's, named in the ledger. A
// volume is known to its tenant by Name (unique per tenant) and to the
// host by Storage (unique), which names its files.
type VolumeRecord struct {
	Name      string
	Storage   string
	State     string // creating, ready or deleting
	SizeBytes int64
	Inodes    int64
	// Tenant owns the volume (principal.Principal.Tenant of its creator;
	// empty without tenants); CreatedBy is the creator's key name.
	Tenant    string
	CreatedBy string
	CreatedAt time.Time
}

const volumeColumns = `name, storage, state, size_bytes, inodes, tenant, created_by, created_at`

// InsertVolume records volume r. The tenant has a volume of that name
// already: ErrExists, and nothing changes.
func (s *Store) InsertVolume(ctx context.Context, r *VolumeRecord) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant, name) DO NOTHING`,
			r.Name, r.Storage, r.State, r.SizeBytes, r.Inodes, r.Tenant, r.CreatedBy, nanos(r.CreatedAt))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrExists
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrExists) {
		return fmt.Errorf("store: insert volume %s: %w", r.Name, err)
	}
	return err
}

func scanVolume(r rowScanner) (*VolumeRecord, error) {
	var (
		v       VolumeRecord
		created int64
	)
	if err := r.Scan(&v.Name, &v.Storage, &v.State, &v.SizeBytes, &v.Inodes, &v.Tenant, &v.CreatedBy, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = fromNanos(created)
	return &v, nil
}

// GetVolume returns tenant's volume name, or an error wrapping ErrNotFound.
func (s *Store) GetVolume(ctx context.Context, tenant, name string) (*VolumeRecord, error) {
	r, err := scanVolume(s.r.QueryRowContext(ctx, "SELECT "+volumeColumns+" FROM volumes WHERE tenant = ? AND name = ?", tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get volume %s: %w", name, err)
	}
	return r, nil
}

// ListVolumes lists every volume by name (then tenant).
func (s *Store) ListVolumes(ctx context.Context) ([]*VolumeRecord, error) {
	return queryAll(ctx, s.r, "list volumes", scanVolume, "SELECT "+volumeColumns+" FROM volumes ORDER BY name, tenant")
}

// SetVolumeState moves the volume of storage name name to state.
func (s *Store) SetVolumeState(ctx context.Context, name, state string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE volumes SET state = ? WHERE storage = ?", state, name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: set volume %s %s: %w", name, state, err)
	}
	return nil
}

// DeleteVolume drops the row of the volume of storage name name; a missing
// one is already gone.
func (s *Store) DeleteVolume(ctx context.Context, name string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM volumes WHERE storage = ?", name)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: delete volume %s: %w", name, err)
	}
	return nil
}
