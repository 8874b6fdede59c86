package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// TemplateRecord is the row of one template; Spec is its definition as
// JSON (apitypes.TemplateCreateRequest).
type TemplateRecord struct {
	Name      string
	Spec      []byte
	CreatedAt time.Time
}

// InsertTemplate records template r; one of that name exists: ErrExists.
func (s *Store) InsertTemplate(ctx context.Context, r *TemplateRecord) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO templates (name, spec, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`,
			r.Name, string(r.Spec), nanos(r.CreatedAt))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrExists
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrExists) {
		return fmt.Errorf("store: insert template %s: %w", r.Name, err)
	}
	return err
}

func scanTemplate(r rowScanner) (*TemplateRecord, error) {
	var (
		t       TemplateRecord
		spec    string
		created int64
	)
	if err := r.Scan(&t.Name, &spec, &created); err != nil {
		return nil, err
	}
	t.Spec, t.CreatedAt = []byte(spec), fromNanos(created)
	return &t, nil
}

// GetTemplate returns template name, or an error wrapping ErrNotFound.
func (s *Store) GetTemplate(ctx context.Context, name string) (*TemplateRecord, error) {
	r, err := scanTemplate(s.r.QueryRowContext(ctx, "SELECT name, spec, created_at FROM templates WHERE name = ?", name))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get template %s: %w", name, err)
	}
	return r, nil
}

// ListTemplates lists every template by name.
func (s *Store) ListTemplates(ctx context.Context) ([]*TemplateRecord, error) {
	return queryAll(ctx, s.r, "list templates", scanTemplate, "SELECT name, spec, created_at FROM templates ORDER BY name")
}

// DeleteTemplate drops template name; a missing one: ErrNotFound.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM templates WHERE name = ?", name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: delete template %s: %w", name, err)
	}
	return nil
}
