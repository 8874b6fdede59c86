package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// ReserveUsage adds add to key keyID's fleet-wide usage if the result
// stays within q (a zero limit is no limit), or refuses with
// `limit_exceeded` naming the quota. It is one conditional upsert
// (reserveSQL): the row lock it takes makes concurrent reservations from
// any number of gateways queue, and each re-checks the condition against
// the row as the one before it left it, so that together they never
// exceed q.
func (s *Store) ReserveUsage(ctx context.Context, keyID string, add apitypes.KeyUse, q apitypes.Quota) error {
	if keyID == "" {
		return errdefs.Invalidf("key_id: empty")
	}
	if add.Sandboxes < 0 || add.MemoryMB < 0 || add.CPUs < 0 || add.DiskMB < 0 {
		return errdefs.Invalidf("usage: a reservation adds, got %+v", add)
	}
	tag, err := s.pool.Exec(ctx, reserveSQL, keyID, add.Sandboxes, add.MemoryMB, add.CPUs, add.DiskMB, q.Sandboxes, q.MemoryMB, q.CPUs, q.DiskMB)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "reserve usage of key %s", keyID)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return s.refusal(ctx, keyID, add, q)
}

// reserveSQL adds $2..$5 to key $1's usage if the sums stay within the
// quota $6..$9 (0: no limit), in one statement (one round trip, its own
// transaction): an upsert whose update is conditional. A key's first
// reservation inserts its row if the addition alone fits; later ones
// conflict on it, and ON CONFLICT DO UPDATE locks the row and evaluates
// the condition on its newest version, so concurrent reservations from
// every gateway queue on the row and never exceed the quota together.
// It returns the key's id when it reserved, no row when the quota
// refused.
const reserveSQL = `INSERT INTO key_usage AS u (key_id, sandboxes, memory_mb, cpus, disk_mb)
	SELECT $1::text, $2::bigint, $3::bigint, $4::float8, $5::bigint
	WHERE ($6::bigint = 0 OR $2::bigint <= $6::bigint) AND ($7::bigint = 0 OR $3::bigint <= $7::bigint)
	AND ($8::float8 = 0 OR $4::float8 <= $8::float8 + 1e-9) AND ($9::bigint = 0 OR $5::bigint <= $9::bigint)
	ON CONFLICT (key_id) DO UPDATE SET sandboxes = u.sandboxes + EXCLUDED.sandboxes, memory_mb = u.memory_mb + EXCLUDED.memory_mb,
		cpus = u.cpus + EXCLUDED.cpus, disk_mb = u.disk_mb + EXCLUDED.disk_mb
	WHERE ($6::bigint = 0 OR u.sandboxes + EXCLUDED.sandboxes <= $6::bigint)
	AND ($7::bigint = 0 OR u.memory_mb + EXCLUDED.memory_mb <= $7::bigint)
	AND ($8::float8 = 0 OR u.cpus + EXCLUDED.cpus <= $8::float8 + 1e-9)
	AND ($9::bigint = 0 OR u.disk_mb + EXCLUDED.disk_mb <= $9::bigint)
	RETURNING u.key_id`

// refusal is the limit_exceeded error of a reservation the quota refused,
// naming the quota at fault.
func (s *Store) refusal(ctx context.Context, keyID string, add apitypes.KeyUse, q apitypes.Quota) error {
	use, err := s.Usage(ctx, keyID)
	if err != nil {
		return err
	}
	switch {
	case q.Sandboxes > 0 && use.Sandboxes+add.Sandboxes > q.Sandboxes:
		return errdefs.LimitExceededf("quota sandboxes: key %s may hold %d live sandboxes across the fleet and holds %d", keyID, q.Sandboxes, use.Sandboxes)
	case q.MemoryMB > 0 && use.MemoryMB+add.MemoryMB > q.MemoryMB:
		return errdefs.LimitExceededf("quota memory_mb: key %s may hold %d MiB across the fleet and holds %d MiB; this sandbox asks %d MiB", keyID, q.MemoryMB, use.MemoryMB, add.MemoryMB)
	case q.CPUs > 0 && use.CPUs+add.CPUs > q.CPUs+1e-9:
		return errdefs.LimitExceededf("quota cpus: key %s may hold %g CPUs across the fleet and holds %g; this sandbox asks %g", keyID, q.CPUs, use.CPUs, add.CPUs)
	default:
		return errdefs.LimitExceededf("quota disk_mb: key %s may hold %d MiB of disk across the fleet and holds %d MiB; this sandbox asks %d MiB", keyID, q.DiskMB, use.DiskMB, add.DiskMB)
	}
}

// ReleaseUsage takes sub off key keyID's usage (a sandbox ended, or a
// create that reserved failed). It never goes below zero.
func (s *Store) ReleaseUsage(ctx context.Context, keyID string, sub apitypes.KeyUse) error {
	_, err := s.pool.Exec(ctx, `UPDATE key_usage SET sandboxes = GREATEST(sandboxes - $2, 0), memory_mb = GREATEST(memory_mb - $3, 0),
		cpus = GREATEST(cpus - $4, 0), disk_mb = GREATEST(disk_mb - $5, 0) WHERE key_id = $1`,
		keyID, sub.Sandboxes, sub.MemoryMB, sub.CPUs, sub.DiskMB)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "release usage of key %s", keyID)
	}
	return nil
}

// Usage is key keyID's fleet-wide usage (zero for a key that never
// reserved).
func (s *Store) Usage(ctx context.Context, keyID string) (apitypes.KeyUse, error) {
	var u apitypes.KeyUse
	err := s.pool.QueryRow(ctx, `SELECT sandboxes, memory_mb, cpus, disk_mb FROM key_usage WHERE key_id = $1`, keyID).
		Scan(&u.Sandboxes, &u.MemoryMB, &u.CPUs, &u.DiskMB)
	if err == pgx.ErrNoRows {
		return u, nil
	}
	if err != nil {
		return u, fmt.Errorf("pgstore: usage of key %s: %w", keyID, err)
	}
	return u, nil
}
