// Package pgstore is the fleet's shared store on PostgreSQL (through pgx):
// the API keys, the per-key usage counted across every node, the audit log
// as hash-chained rows and its checkpoints — what several gateways on
// several hosts must see alike, which the daemon's SQLite file (pkg/store)
// cannot give them. It offers the same methods pkg/tenants (KeyStore) and
// pkg/audit (Checkpoints) ask of pkg/store, with the same semantics, so a
// daemon runs on either; SQLite stays the single-machine default.
//
// Schema: versioned migrations of its own (table pgstore_migrations), run
// under a session advisory lock, so that two gateways starting at once
// against an empty database apply each migration exactly once.
//
// Changes to keys are announced with NOTIFY on channel KeysChannel in the
// transaction that makes them; WatchKeys listens, so that a key created or
// revoked through one gateway is known to every other within the time a
// notification takes, not at their next restart.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// KeysChannel is the NOTIFY channel of key changes.
const KeysChannel = "sandboxd_keys"

// migrationLock is the advisory lock key the migrations run under (any
// constant distinct from other users of the database; "sbxd" in ASCII).
const migrationLock int64 = 0x73627864

// migrations are applied in order; a migration, once released, never
// changes (a new one is appended instead).
var migrations = []string{
	1: `
CREATE TABLE api_keys (
	id text PRIMARY KEY,
	name text NOT NULL UNIQUE,
	tenant text NOT NULL,
	admin boolean NOT NULL,
	hash bytea NOT NULL,
	quota text NOT NULL DEFAULT '{}',
	created_at bigint NOT NULL,
	last_used_at bigint NOT NULL DEFAULT 0,
	expires_at bigint NOT NULL DEFAULT 0,
	revoked_at bigint NOT NULL DEFAULT 0
);
CREATE TABLE key_usage (
	key_id text PRIMARY KEY,
	sandboxes bigint NOT NULL DEFAULT 0 CHECK (sandboxes >= 0),
	memory_mb bigint NOT NULL DEFAULT 0 CHECK (memory_mb >= 0),
	cpus double precision NOT NULL DEFAULT 0,
	disk_mb bigint NOT NULL DEFAULT 0 CHECK (disk_mb >= 0)
);
CREATE TABLE audit_checkpoints (
	seq bigint PRIMARY KEY,
	hash text NOT NULL,
	at bigint NOT NULL
);
CREATE TABLE audit_records (
	seq bigint PRIMARY KEY,
	line text NOT NULL
);
CREATE TABLE audit_head (
	id int PRIMARY KEY CHECK (id = 1),
	seq bigint NOT NULL,
	hash text NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, repeat('0', 64));
`,
	2: `
-- One row per sandbox a gateway admitted against a key's fleet quota
-- (usage.go): key_usage is the sum of a key's rows, kept in the same
-- transactions, so that a release is idempotent (whoever deletes the row
-- takes its share off) and any gateway can release what another reserved.
-- sandbox_id and node are set once the node created it (bound_at, the
-- database's clock); a reservation never bound is a create that did not
-- finish.
CREATE TABLE fleet_sandboxes (
	reservation text PRIMARY KEY,
	key_id text NOT NULL,
	sandboxes bigint NOT NULL,
	memory_mb bigint NOT NULL,
	cpus double precision NOT NULL,
	disk_mb bigint NOT NULL,
	reserved_at timestamptz NOT NULL DEFAULT now(),
	sandbox_id text UNIQUE,
	node text,
	bound_at timestamptz
);
CREATE INDEX fleet_sandboxes_node ON fleet_sandboxes (node, bound_at);
-- The nonces of the gateways' web editor login tokens that were redeemed
-- (fleet.go, UseLogin): a token is single-use across every gateway.
CREATE TABLE ui_logins (
	nonce text PRIMARY KEY,
	expires_at timestamptz NOT NULL
);
`,
}

// Store is a connection pool to the fleet's database.
type Store struct {
	pool *pgxpool.Pool
}

// Open connects to url (a PostgreSQL URL or key=value string), checks it
// answers, and brings its schema up to date.
func Open(ctx context.Context, url string) (*Store, error) {
	if url == "" {
		return nil, errdefs.Invalidf("store.postgres_url: empty")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password and all: say only why.
		return nil, errdefs.Invalidf("store.postgres_url: not a PostgreSQL connection string (%s)", redact(err))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func redact(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		return "cannot parse the URL"
	}
	return msg
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// SchemaVersion is the newest migration this package knows.
func SchemaVersion() int { return len(migrations) - 1 }

// migrate applies the missing migrations. A session advisory lock on one
// connection serialises concurrent starters: the second waits, then finds
// every migration applied.
func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: connect: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return fmt.Errorf("pgstore: migration lock: %w", err)
	}
	defer func() {
		// A new context: the caller's may be done, and the lock must go.
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", migrationLock); err != nil {
			conn.Conn().Close(uctx) // a closed session drops its locks
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgstore_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("pgstore: migrations table: %w", err)
	}
	var have int
	if err := conn.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM pgstore_migrations`).Scan(&have); err != nil {
		return fmt.Errorf("pgstore: schema version: %w", err)
	}
	if have > SchemaVersion() {
		return fmt.Errorf("pgstore: the database's schema is version %d, newer than this binary's %d: upgrade the binary", have, SchemaVersion())
	}
	for v := have + 1; v <= SchemaVersion(); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO pgstore_migrations (version) VALUES ($1)`, v)
			return err
		})
		if err != nil {
			return fmt.Errorf("pgstore: migration %d: %w", v, err)
		}
	}
	return nil
}

// Migrations returns the versions applied, oldest first.
func (s *Store) Migrations(ctx context.Context) ([]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT version FROM pgstore_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
