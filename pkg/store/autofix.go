package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// AutofixSession is the row of one autofix loop; State is pkg/autofix's
// state, opaque here.
type AutofixSession struct {
	ID        string
	RunID     string
	SandboxID string
	Status    string
	CreatedAt time.Time
	UpdatedAt time.Time
	ExpiresAt time.Time // zero: does not expire
	State     json.RawMessage
}

const autofixColumns = `id, run_id, sandbox_id, status, created_at, updated_at, expires_at, state`

// PutAutofixSession inserts or replaces session a.ID.
func (s *Store) PutAutofixSession(ctx context.Context, a *AutofixSession) error {
	if a.ID == "" {
		return errors.New("store: put autofix session: id is required")
	}
	if !json.Valid(a.State) {
		return fmt.Errorf("store: put autofix session %s: state is not valid JSON", a.ID)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO autofix_sessions (`+autofixColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			a.ID, a.RunID, a.SandboxID, a.Status, nanos(a.CreatedAt), nanos(a.UpdatedAt), nanos(a.ExpiresAt), string(a.State))
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put autofix session %s: %w", a.ID, err)
	}
	return nil
}

func scanAutofix(r rowScanner) (*AutofixSession, error) {
	var (
		a                         AutofixSession
		created, updated, expires int64
		state                     string
	)
	if err := r.Scan(&a.ID, &a.RunID, &a.SandboxID, &a.Status, &created, &updated, &expires, &state); err != nil {
		return nil, err
	}
	a.CreatedAt, a.UpdatedAt, a.ExpiresAt = fromNanos(created), fromNanos(updated), fromNanos(expires)
	a.State = json.RawMessage(state)
	return &a, nil
}

// GetAutofixSession returns session id, or an error wrapping ErrNotFound.
func (s *Store) GetAutofixSession(ctx context.Context, id string) (*AutofixSession, error) {
	a, err := scanAutofix(s.r.QueryRowContext(ctx, "SELECT "+autofixColumns+" FROM autofix_sessions WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get autofix session %s: %w", id, err)
	}
	return a, nil
}

// ExpiredAutofixSessions lists the sessions with the given status whose
// expiry is before now.
func (s *Store) ExpiredAutofixSessions(ctx context.Context, status string, now time.Time) ([]*AutofixSession, error) {
	return queryAll(ctx, s.r, "list expired autofix sessions", scanAutofix,
		"SELECT "+autofixColumns+" FROM autofix_sessions WHERE status = ? AND expires_at > 0 AND expires_at < ? ORDER BY expires_at",
		status, nanos(now))
}

// AutofixSessionsByStatus lists the sessions with the given status.
func (s *Store) AutofixSessionsByStatus(ctx context.Context, status string) ([]*AutofixSession, error) {
	return queryAll(ctx, s.r, "list autofix sessions", scanAutofix,
		"SELECT "+autofixColumns+" FROM autofix_sessions WHERE status = ? ORDER BY created_at", status)
}

// DeleteAutofixSessions deletes the sessions not updated since before,
// except those waiting for a fix or running; it returns how many it
// deleted.
func (s *Store) DeleteAutofixSessions(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM autofix_sessions
			WHERE updated_at < ? AND status NOT IN ('running', 'needs_fix')`, nanos(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: delete autofix sessions: %w", err)
	}
	return n, nil
}
