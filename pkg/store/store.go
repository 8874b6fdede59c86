// Package store is mcp-sandboxd's persistent state: an SQLite database
// (modernc.org/sqlite, pure Go) holding sandboxes and the history of their
// state changes, and later run records and artifacts.
//
// The store guarantees atomicity, not policy: Transition is a compare-and-set
// on a sandbox's state that also writes an event row, in one transaction,
// while which transitions are legal is pkg/sandbox's business.
//
// # Connections
//
// SQLite allows one writer at a time per database. Rather than let
// goroutines race for the write lock inside SQLite (and sleep in busy_timeout
// loops, or fail with SQLITE_BUSY when a read transaction tries to upgrade),
// the Store funnels every write through a pool of exactly one connection,
// whose transactions start with BEGIN IMMEDIATE: writers queue in
// database/sql, in Go, and each transaction owns the write lock from its
// first statement. Reads go through a separate pool of read-only
// connections; in WAL mode they see the last committed state and neither
// block nor are blocked by the writer. busy_timeout remains for contention
// with another process, such as an administrator's sqlite3 shell.
//
// # Time
//
// Timestamps are stored as INTEGER Unix nanoseconds, UTC: they sort and
// compare as numbers (retention is a range query) and keep full precision.
// The zero time.Time is stored as 0 and read back as the zero time.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Errors callers test with errors.Is.
var (
	// ErrNotFound means no sandbox has the given id.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists means InsertSandbox was given an id already in use.
	ErrAlreadyExists = errors.New("already exists")
	// ErrStateMismatch means Transition found the sandbox in another state
	// than the one expected; the error is a *StateMismatchError.
	ErrStateMismatch = errors.New("state mismatch")
	// ErrSchemaTooNew means the database was migrated by a newer build of
	// mcp-sandboxd than this one; opening it could corrupt what it stored.
	ErrSchemaTooNew = errors.New("database schema is newer than this program")
)

const (
	// busyTimeoutMS is how long a connection waits for a lock held by
	// another process before failing with SQLITE_BUSY.
	busyTimeoutMS = 5000
	// maxReaders bounds the read pool. Reads are short point lookups and
	// small lists; a few connections keep /metrics, list calls and event
	// catch-up from queuing behind each other.
	maxReaders = 4
)

// Store is the SQLite state database. It is safe for concurrent use.
type Store struct {
	w *sql.DB // the one writer connection; see the package documentation
	r *sql.DB // read-only connections

	// Statements of the hottest writes (a command's running and ready
	// transitions, TransitionActive), prepared once on the writer: SQLite
	// compiles a statement in about as long as it runs one.
	setState, addEvent *sql.Stmt
}

// Open opens the database at path, creating it and its directory if needed,
// and migrates its schema to the latest version this build knows. A database
// migrated by a newer build is refused with an error wrapping
// ErrSchemaTooNew.
func Open(ctx context.Context, path string) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// The database holds sandbox specs, environment variables included, so
	// neither it nor its directory is readable by others. Creating the file
	// up front fixes its mode: SQLite gives the -wal and -shm files the mode
	// of the database file.
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("store: create directory: %w", err)
	}
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}

	w, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_journal_mode": {"WAL"},
		"_synchronous":  {"NORMAL"}, // durable across crashes of the process; a power loss may drop the last commits, never corrupt
		"_foreign_keys": {"1"},
		"_busy_timeout": {fmt.Sprint(busyTimeoutMS)},
		"_txlock":       {"immediate"},
	}))
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	s := &Store{w: w}

	// journal_mode=WAL silently stays in rollback mode on file systems
	// without shared memory support; readers would then block the writer.
	var mode string
	if err := w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	if mode != "wal" {
		w.Close()
		return nil, fmt.Errorf("store: open %s: journal mode is %q, not wal (is the state directory on a network file system?)", abs, mode)
	}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", abs, err)
	}

	if err := s.prepare(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}

	r, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_query_only":   {"1"},
		"_busy_timeout": {fmt.Sprint(busyTimeoutMS)},
	}))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	r.SetMaxOpenConns(maxReaders)
	r.SetMaxIdleConns(maxReaders) // a new connection re-runs the open and its pragmas
	if err := r.PingContext(ctx); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	s.r = r
	return s, nil
}

// dsn builds a file: URI for path with the driver's query parameters. The
// path is escaped, so names containing '?' or '#' stay names.
func dsn(path string, params url.Values) string {
	return (&url.URL{Scheme: "file", Path: path, RawQuery: params.Encode()}).String()
}

// Ping checks that the database answers, for readiness checks.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.r.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// CheckWritable commits a write, for readiness: a full disk, a read-only
// filesystem or a database that cannot be written fails here instead of in
// the middle of a sandbox's state change. The write bumps the database
// header's user_version, which nothing else uses, so no table grows.
func (s *Store) CheckWritable(ctx context.Context) error {
	var v int64
	if err := s.w.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("store: read probe: %w", err)
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", (v+1)%(1<<31))); err != nil {
		return fmt.Errorf("store: not writable: %w", err)
	}
	return nil
}

// Close closes the database. Queries in flight fail.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.setState.Close(), s.addEvent.Close(), s.w.Close())
}

// write runs fn in a write transaction and commits it if fn succeeds.
func (s *Store) write(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback() // the error from fn is the one worth reporting
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// nanos encodes t for an INTEGER column.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromNanos decodes an INTEGER column written by nanos.
func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// rowScanner is what a scan function reads one row from.
type rowScanner interface{ Scan(...any) error }

// queryAll runs a read query and turns every row into a T with scan; what
// names the operation in errors.
func queryAll[T any](ctx context.Context, db *sql.DB, what string, scan func(rowScanner) (T, error), q string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("store: %s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return out, nil
}
