package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migration is one numbered step of the schema. Migrations are append-only:
// once released, a migration is never edited or reordered, because databases
// in the field have already applied it; a change is a new migration. Each
// runs in its own transaction together with its schema_migrations row, so a
// crash leaves the database at one version or the next, never between.
type migration struct {
	version     int
	description string
	sql         string
}

// migrations is the schema history, version 1 first, numbered without gaps
// (a test checks). Run records (v2) and the resource ledger (v3) were appended
// when the packages that own them needed tables.
var migrations = []migration{
	{
		version:     1,
		description: "sandboxes and their state-change events",
		sql: `
CREATE TABLE sandboxes (
	id                 TEXT PRIMARY KEY,
	state              TEXT NOT NULL,
	language           TEXT NOT NULL DEFAULT '',
	image              TEXT NOT NULL DEFAULT '',
	image_digest       TEXT NOT NULL DEFAULT '',
	spec               TEXT CHECK (spec IS NULL OR json_valid(spec)), -- opaque to the store
	cgroup_path        TEXT NOT NULL DEFAULT '',
	init_pid           INTEGER NOT NULL DEFAULT 0,
	init_start_time    INTEGER NOT NULL DEFAULT 0, -- /proc/PID/stat starttime, against PID reuse
	created_at         INTEGER NOT NULL,           -- Unix nanoseconds, as every *_at column
	updated_at         INTEGER NOT NULL,
	last_active_at     INTEGER NOT NULL,
	terminated_at      INTEGER,                    -- NULL while the sandbox lives
	termination_reason TEXT NOT NULL DEFAULT ''
) STRICT;

CREATE INDEX sandboxes_by_state ON sandboxes (state);
CREATE INDEX sandboxes_by_created_at ON sandboxes (created_at);
CREATE INDEX sandboxes_by_terminated_at ON sandboxes (terminated_at) WHERE terminated_at IS NOT NULL;

-- AUTOINCREMENT so that an event id is never reused after retention deletes
-- rows: clients resume event streams from the last id they saw.
CREATE TABLE sandbox_events (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	at         INTEGER NOT NULL,
	from_state TEXT NOT NULL, -- '' for the creation event
	to_state   TEXT NOT NULL,
	reason     TEXT NOT NULL DEFAULT ''
) STRICT;

CREATE INDEX sandbox_events_by_sandbox ON sandbox_events (sandbox_id, id);
`,
	},
	{
		version:     2,
		description: "run records",
		sql: `
-- One row per run record directory (pkg/runs); the directory holds the
-- logs and files, the row what listing and retention need.
CREATE TABLE runs (
	id          TEXT PRIMARY KEY,           -- <YYYYMMDD_HHMMSS>_<4 hex>, the directory name
	kind        TEXT NOT NULL DEFAULT 'run', -- run | autofix
	language    TEXT NOT NULL DEFAULT '',
	sandbox_id  TEXT NOT NULL DEFAULT '',   -- no foreign key: runs outlive sandbox rows
	image       TEXT NOT NULL DEFAULT '',
	started_at  INTEGER NOT NULL,
	ended_at    INTEGER NOT NULL DEFAULT 0,
	duration_ms INTEGER NOT NULL DEFAULT 0,
	exit_code   INTEGER NOT NULL DEFAULT 0,
	success     INTEGER NOT NULL DEFAULT 0,
	termination TEXT NOT NULL DEFAULT '',
	size_bytes  INTEGER NOT NULL DEFAULT 0, -- the directory's size, for retention
	metadata    TEXT CHECK (metadata IS NULL OR json_valid(metadata))
) STRICT;

CREATE INDEX runs_by_started_at ON runs (started_at);
CREATE INDEX runs_by_language ON runs (language, started_at);
`,
	},
	{
		version:     3,
		description: "resource ledger",
		sql: `
-- What each sandbox holds outside the database (pkg/ledger): one row per
-- resource, written before the resource is acquired and deleted once it is
-- released, so that after a crash the rows name everything that may exist.
-- No foreign key: a row must outlive a sandbox row deleted by retention
-- until the resource is really gone.
CREATE TABLE ledger (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT, -- acquisition order; release walks it backwards
	owner      TEXT NOT NULL,                     -- a sandbox id
	kind       TEXT NOT NULL,                     -- container, cgroup, layers, dir, netns, veth, lease, qemu, ...
	key        TEXT NOT NULL,                     -- what names the resource: a path, a device, an address
	data       TEXT CHECK (data IS NULL OR json_valid(data)),
	created_at INTEGER NOT NULL,
	UNIQUE (owner, kind, key)
) STRICT;
CREATE INDEX ledger_by_owner ON ledger (owner, seq);
`,
	},
	{
		version:     4,
		description: "autofix sessions",
		sql: `
-- One row per autofix loop (pkg/autofix): its whole state as JSON, so that
-- a client-provider session waiting for autofix_submit survives a daemon
-- restart, and autofix_status can report any loop.
CREATE TABLE autofix_sessions (
	id         TEXT PRIMARY KEY,          -- af-<hex>
	run_id     TEXT NOT NULL DEFAULT '',  -- the run record (no foreign key: retention may drop it first)
	sandbox_id TEXT NOT NULL DEFAULT '',
	status     TEXT NOT NULL,             -- running | needs_fix | fixed | failed | expired
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL DEFAULT 0, -- needs_fix: when an unanswered session expires
	state      TEXT NOT NULL CHECK (json_valid(state))
) STRICT;

CREATE INDEX autofix_sessions_by_status ON autofix_sessions (status, expires_at);
`,
	},
	{
		version:     5,
		description: "network address leases",
		sql: `
-- One IPv4 address of network.subnet per sandbox with network (pkg/network).
-- The primary key makes handing out an address twice impossible, also
-- across restarts; no foreign key: a lease of a sandbox whose row is gone
-- is an orphan that gc removes, not a reason to refuse the delete.
CREATE TABLE network_leases (
	ip          TEXT PRIMARY KEY,     -- dotted quad
	sandbox_id  TEXT NOT NULL UNIQUE,
	acquired_at INTEGER NOT NULL
) STRICT;
`,
	},
	{
		version:     6,
		description: "preview port exposures",
		sql: `
-- Ports of live sandboxes served by the preview listener (pkg/services/ports),
-- so that they survive a daemon restart like their sandboxes do. The token
-- is kept as issued (the state directory is root's, like the API token
-- file): listing an exposure shows its URL again. Rows of sandboxes that
-- are no longer live are removed at startup.
CREATE TABLE port_exposures (
	sandbox_id TEXT NOT NULL,
	port       INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
	token      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, port)
) STRICT;
`,
	},
	{
		version:     7,
		description: "workspace snapshots",
		sql: `
-- One row per workspace snapshot (pkg/services/snapshots): the archive
-- state_dir/snapshots/<id>.tar.zst is named by its sha256, which is the id.
-- No foreign key to sandboxes: a snapshot outlives its sandbox (forks,
-- restores), and retention may drop the sandbox's row first.
CREATE TABLE snapshots (
	id            TEXT PRIMARY KEY,           -- hex sha256 of the archive
	name          TEXT NOT NULL DEFAULT '',
	sandbox_id    TEXT NOT NULL,              -- the sandbox it was taken of
	language      TEXT NOT NULL,
	image         TEXT NOT NULL,
	image_digest  TEXT NOT NULL,
	disk_backing  TEXT NOT NULL DEFAULT '',
	size_bytes    INTEGER NOT NULL,           -- the archive (compressed)
	content_bytes INTEGER NOT NULL,           -- its files' bytes (what a restore writes)
	created_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_at);
CREATE INDEX snapshots_by_age ON snapshots (created_at);
`,
	},
	{
		version:     8,
		description: "user namespace id ranges",
		sql: `
-- One range of host uids/gids of sandbox.userns_pool per sandbox
-- (pkg/userns): slot n is ids base+n*size .. base+(n+1)*size-1. The
-- primary key makes handing out a range twice impossible, also across
-- restarts; a row is deleted only when the ledger releases the sandbox's
-- range, after every process and file of it is gone.
CREATE TABLE userns_ranges (
	slot        INTEGER PRIMARY KEY,
	sandbox_id  TEXT NOT NULL UNIQUE,
	acquired_at INTEGER NOT NULL
) STRICT;
`,
	},
	{
		version:     9,
		description: "API keys",
		sql: `
-- One row per API key (pkg/tenants). The secret is never stored: hash is
-- the SHA-256 of the key as clients send it (keys are 160 random bits, so
-- a fast hash is enough; no dictionary reaches them). quota is the key's
-- quota as JSON; expires_at and revoked_at are 0 when not set.
CREATE TABLE api_keys (
	id           TEXT PRIMARY KEY,
	name         TEXT NOT NULL UNIQUE,
	tenant       TEXT NOT NULL,
	admin        INTEGER NOT NULL DEFAULT 0,
	hash         BLOB NOT NULL UNIQUE,
	quota        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(quota)),
	created_at   INTEGER NOT NULL,
	last_used_at INTEGER NOT NULL DEFAULT 0,
	expires_at   INTEGER NOT NULL DEFAULT 0,
	revoked_at   INTEGER NOT NULL DEFAULT 0
) STRICT;
`,
	},
	{
		version:     10,
		description: "audit log checkpoints",
		sql: `
-- The audit log's (pkg/audit) newest record's sequence number and hash,
-- stored every so many records: a chain rewritten from some record on, or
-- cut short, disagrees with them. Retention deletes the rows of the
-- records it removes, so a missing file with rows left is tampering.
CREATE TABLE audit_checkpoints (
	seq  INTEGER PRIMARY KEY,
	hash TEXT NOT NULL,
	at   INTEGER NOT NULL
) STRICT;
`,
	},
	{
		version:     11,
		description: "ssh public keys",
		sql: `
-- Public keys that may open SSH sessions (pkg/sshd, pkg/services/sshkeys).
-- tenant is the owner ("" for the administrator); fingerprint (SHA256) is
-- unique so a key belongs to one owner only, which is what lets the
-- endpoint find the owner from the key alone.
CREATE TABLE ssh_keys (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL,
	tenant      TEXT NOT NULL,
	fingerprint TEXT NOT NULL UNIQUE,
	public_key  TEXT NOT NULL,
	created_at  INTEGER NOT NULL
) STRICT;
`,
	},
	{
		version:     12,
		description: "named volumes; the volumes a snapshot left out",
		sql: `
-- Named volumes (pkg/services/volumes): disk that outlives sandboxes. The
-- row is written (state creating) before anything of the volume exists
-- and the ledger, owner vol-<name>, names its image, loop device and
-- mount; a restart finishes what a crash interrupted: a creating or
-- deleting volume is released and its row dropped, a ready one mounted.
CREATE TABLE volumes (
	name        TEXT PRIMARY KEY,
	state       TEXT NOT NULL,
	size_bytes  INTEGER NOT NULL,
	inodes      INTEGER NOT NULL,
	tenant      TEXT NOT NULL DEFAULT '',
	created_by  TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL
) STRICT;
-- "name:/path" of each volume the sandbox mounted and the archive does
-- not hold, joined by newlines.
ALTER TABLE snapshots ADD COLUMN excluded_volumes TEXT NOT NULL DEFAULT '';
`,
	},
	{
		version:     13,
		description: "templates",
		sql: `
-- Templates (pkg/engine/templates.go): an image, a start command, its
-- readiness check, default limits and network, a warm pool size; spec is
-- apitypes.TemplateCreateRequest as JSON.
CREATE TABLE templates (
	name       TEXT PRIMARY KEY,
	spec       TEXT NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;
`,
	},
	{
		version:     14,
		description: "preview exposures tied to their key; volume names per tenant",
		sql: `
-- The API key that made an exposure: preview requests through it stop
-- when that key is revoked or expires ('' for the unix socket and
-- exposures made before tenants, which no key revocation ends).
ALTER TABLE port_exposures ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
-- Volume names are per tenant: two tenants may each have a volume "data",
-- and a create that clashes says so only within its own tenant. storage
-- names the volume's files (image, mount point, ledger owner vol-<storage>):
-- the name for volumes made before (their files are named so), the name
-- and a random suffix for new ones (unique whatever the tenant).
CREATE TABLE volumes_v14 (
	tenant      TEXT NOT NULL DEFAULT '',
	name        TEXT NOT NULL,
	storage     TEXT NOT NULL UNIQUE,
	state       TEXT NOT NULL,
	size_bytes  INTEGER NOT NULL,
	inodes      INTEGER NOT NULL,
	created_by  TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT;
INSERT INTO volumes_v14 (tenant, name, storage, state, size_bytes, inodes, created_by, created_at)
	SELECT tenant, name, name, state, size_bytes, inodes, created_by, created_at FROM volumes;
DROP TABLE volumes;
ALTER TABLE volumes_v14 RENAME TO volumes;
`,
	},
	{
		version:     15,
		description: "lifecycle webhooks and their delivery queue",
		sql: `
-- Lifecycle webhooks (pkg/services/webhooks), one row per registration.
-- secret is the signing key as issued (whsec_...): the state directory is
-- root's, like the preview tokens'; the API shows it only at creation.
-- events is the subscribed types joined by commas ('' for all).
-- allow_private: an admin registered it, so it may reach a private,
-- loopback or link-local address outside webhooks.allow_private.
-- failures counts failed attempts in a row; disabled_reason is '' while
-- enabled.
CREATE TABLE webhooks (
	id              TEXT PRIMARY KEY,
	tenant          TEXT NOT NULL DEFAULT '',
	name            TEXT NOT NULL,
	url             TEXT NOT NULL,
	secret          TEXT NOT NULL,
	events          TEXT NOT NULL DEFAULT '',
	timeout_ms      INTEGER NOT NULL,
	enabled         INTEGER NOT NULL,
	disabled_reason TEXT NOT NULL DEFAULT '',
	failures        INTEGER NOT NULL DEFAULT 0,
	allow_private   INTEGER NOT NULL DEFAULT 0,
	created_by      TEXT NOT NULL DEFAULT '',
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL
) STRICT;
-- The delivery queue and log: a row is written before the first attempt,
-- so a delivery outlives a restart; id is the message id every attempt
-- sends (webhook-id). No foreign key: deleting a hook deletes its rows
-- in the same transaction.
CREATE TABLE webhook_deliveries (
	id              TEXT PRIMARY KEY,
	webhook_id      TEXT NOT NULL,
	event_type      TEXT NOT NULL,
	payload         BLOB NOT NULL,
	state           TEXT NOT NULL,
	attempts        INTEGER NOT NULL DEFAULT 0,
	next_attempt_at INTEGER NOT NULL DEFAULT 0,
	last_status     INTEGER NOT NULL DEFAULT 0,
	last_error      TEXT NOT NULL DEFAULT '',
	created_at      INTEGER NOT NULL,
	delivered_at    INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, created_at);
`,
	},
}

// migrate brings the schema to the latest version in migrations.
func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, `
CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	applied_at INTEGER NOT NULL
) STRICT`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	latest := migrations[len(migrations)-1].version
	for _, m := range migrations {
		err := s.write(ctx, func(tx *sql.Tx) error {
			// Read the version inside the transaction: it holds the write
			// lock, so another process migrating the same file at the same
			// moment cannot apply a step twice.
			var current int
			if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&current); err != nil {
				return fmt.Errorf("read schema version: %w", err)
			}
			if current > latest {
				return fmt.Errorf("%w: the database is at version %d, this build knows up to %d; upgrade mcp-sandboxd",
					ErrSchemaTooNew, current, latest)
			}
			if current >= m.version {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %d (%s): %w", m.version, m.description, err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
				m.version, nanos(time.Now())); err != nil {
				return fmt.Errorf("record migration %d: %w", m.version, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
