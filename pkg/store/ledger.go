package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// LedgerEntry is one row of the resource ledger (see pkg/ledger).
type LedgerEntry struct {
	Seq       int64
	Owner     string
	Kind      string
	Key       string
	Data      []byte // JSON or nil
	CreatedAt time.Time
}

// AddLedgerEntry records a resource of owner. Recording the same (owner,
// kind, key) again keeps the first row and its place in the order.
func (s *Store) AddLedgerEntry(ctx context.Context, e *LedgerEntry) error {
	var data any
	if len(e.Data) > 0 {
		data = string(e.Data)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (owner, kind, key, data, created_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (owner, kind, key) DO NOTHING`, e.Owner, e.Kind, e.Key, data, nanos(time.Now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("store: record %s %s of %s: %w", e.Kind, e.Key, e.Owner, err)
	}
	return nil
}

// LedgerEntries lists owner's resources in acquisition order.
func (s *Store) LedgerEntries(ctx context.Context, owner string) ([]*LedgerEntry, error) {
	return queryAll(ctx, s.r, "list ledger", scanLedger,
		"SELECT seq, owner, kind, key, data, created_at FROM ledger WHERE owner = ? ORDER BY seq", owner)
}

// LedgerOwners lists the owners that hold at least one resource.
func (s *Store) LedgerOwners(ctx context.Context) ([]string, error) {
	return queryAll(ctx, s.r, "list ledger owners", func(r rowScanner) (string, error) {
		var o string
		err := r.Scan(&o)
		return o, err
	}, "SELECT DISTINCT owner FROM ledger ORDER BY owner")
}

// DeleteLedgerEntries removes released resources, all in one transaction:
// a terminate strikes its sandbox's eight or so rows with one commit
// rather than one each.
func (s *Store) DeleteLedgerEntries(ctx context.Context, seqs ...int64) error {
	if len(seqs) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, "DELETE FROM ledger WHERE seq = ?")
		if err != nil {
			return err
		}
		defer st.Close()
		for _, seq := range seqs {
			if _, err := st.ExecContext(ctx, seq); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: delete ledger entries %v: %w", seqs, err)
	}
	return nil
}

func scanLedger(r rowScanner) (*LedgerEntry, error) {
	var (
		e       LedgerEntry
		data    sql.NullString
		created int64
	)
	if err := r.Scan(&e.Seq, &e.Owner, &e.Kind, &e.Key, &data, &created); err != nil {
		return nil, err
	}
	if data.Valid {
		e.Data = []byte(data.String)
	}
	e.CreatedAt = fromNanos(created)
	return &e, nil
}
