package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The fleet's quota accounting, per sandbox (table fleet_sandboxes). A
// gateway reserves before it places a create (ReserveSandbox: the
// conditional upsert of ReserveUsage and the sandbox's row, in one
// statement), binds the row to the sandbox's id and node once the node
// answered (BindSandbox), and releases it when the create failed. A
// sandbox ends on its node — terminated through any gateway or directly,
// expired, or garbage-collected — so a gateway that sees it end releases
// it (ReleaseSandbox after a terminate it forwarded) and every gateway
// reconciles the bound rows of each node that answers against that node's
// live sandboxes (ReconcileNode). Releasing is deleting the row and taking
// its share off key_usage in one transaction: whoever deletes it releases,
// so two gateways that see the same end release it once.
//
// A node that does not answer is not reconciled: its sandboxes stay
// counted (they outlive the daemon, and come back with it). A node removed
// from the fleet for good keeps its rows until an operator releases them
// (ReleaseNode).

// ReserveSandbox reserves one sandbox of add for key keyID within q, or
// refuses with limit_exceeded naming the quota; it returns the
// reservation's id, which BindSandbox and ReleaseSandbox take.
func (s *Store) ReserveSandbox(ctx context.Context, keyID string, add apitypes.KeyUse, q apitypes.Quota) (string, error) {
	if keyID == "" {
		return "", errdefs.Invalidf("key_id: empty")
	}
	if add.Sandboxes != 1 || add.MemoryMB < 0 || add.CPUs < 0 || add.DiskMB < 0 {
		return "", errdefs.Invalidf("usage: a sandbox's reservation is one sandbox and non-negative limits, got %+v", add)
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	res := "rsv-" + hex.EncodeToString(b)
	// One statement, one round trip: the reservation is on a create's
	// path before placement, where the gateway may add at most 2 ms.
	tag, err := s.pool.Exec(ctx, `WITH r AS (`+reserveSQL+`)
		INSERT INTO fleet_sandboxes (reservation, key_id, sandboxes, memory_mb, cpus, disk_mb) SELECT $10::text, key_id, $2::bigint, $3::bigint, $4::float8, $5::bigint FROM r`,
		keyID, add.Sandboxes, add.MemoryMB, add.CPUs, add.DiskMB, q.Sandboxes, q.MemoryMB, q.CPUs, q.DiskMB, res)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "reserve a sandbox of key %s", keyID)
	}
	if tag.RowsAffected() != 1 {
		return "", s.refusal(ctx, keyID, add, q)
	}
	return res, nil
}

// BindSandbox names the sandbox a reservation became and its node.
func (s *Store) BindSandbox(ctx context.Context, reservation, sandboxID, node string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE fleet_sandboxes SET sandbox_id = $2, node = $3, bound_at = now() WHERE reservation = $1`, reservation, sandboxID, node)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "bind reservation %s to sandbox %s", reservation, sandboxID)
	}
	if tag.RowsAffected() != 1 {
		// Released meanwhile (a reconciliation cannot: the row was not
		// bound; an operator's ReleaseStale can).
		return errdefs.NotFoundf("reservation: %s is no longer held", reservation)
	}
	return nil
}

// releaseWhere deletes the rows cond (with args) selects and takes their
// shares off key_usage, in one transaction; it returns how many.
func (s *Store) releaseWhere(ctx context.Context, cond string, args ...any) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// One statement: the DELETE's rows feed the UPDATE, so no row is
		// taken off twice however many gateways release at once.
		return tx.QueryRow(ctx, `WITH gone AS (DELETE FROM fleet_sandboxes WHERE `+cond+` RETURNING key_id, sandboxes, memory_mb, cpus, disk_mb),
			sums AS (SELECT key_id, sum(sandboxes) AS s, sum(memory_mb) AS m, sum(cpus) AS c, sum(disk_mb) AS d FROM gone GROUP BY key_id),
			upd AS (UPDATE key_usage u SET sandboxes = GREATEST(u.sandboxes - sums.s, 0), memory_mb = GREATEST(u.memory_mb - sums.m, 0),
				cpus = GREATEST(u.cpus - sums.c, 0), disk_mb = GREATEST(u.disk_mb - sums.d, 0)
			FROM sums WHERE u.key_id = sums.key_id RETURNING 1)
			SELECT count(*) FROM gone`, args...).Scan(&n)
	})
	return n, err
}

// ReleaseReservation releases a reservation (its create failed). Releasing
// one already released does nothing.
func (s *Store) ReleaseReservation(ctx context.Context, reservation string) error {
	if _, err := s.releaseWhere(ctx, `reservation = $1`, reservation); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "release reservation %s", reservation)
	}
	return nil
}

// ReleaseSandbox releases the reservation of sandbox id (it ended).
// Releasing one not held (never counted, or released already) does
// nothing.
func (s *Store) ReleaseSandbox(ctx context.Context, id string) error {
	if _, err := s.releaseWhere(ctx, `sandbox_id = $1`, id); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "release sandbox %s", id)
	}
	return nil
}

// Now is the database's clock: what ReconcileNode's since is measured on
// (bound_at is the database's too), so that gateways' clocks never matter.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&t)
	return t, err
}

// ReconcileNode releases the sandboxes of node bound before since (the
// database's time before the node's list was asked for) that live, the
// node's live sandboxes, does not hold: they ended there. A row bound
// after since is left alone: the list may predate its sandbox. It returns
// how many it released.
func (s *Store) ReconcileNode(ctx context.Context, node string, since time.Time, live []string) (int, error) {
	if live == nil {
		live = []string{}
	}
	n, err := s.releaseWhere(ctx, `node = $1 AND bound_at < $2 AND NOT (sandbox_id = ANY($3))`, node, since, live)
	if err != nil {
		return 0, errdefs.Wrap(errdefs.Internal, err, "reconcile node %s", node)
	}
	return n, nil
}

// ReleaseStale releases reservations never bound and older than age: the
// gateway that made them stopped before the node answered (its create
// either failed, or made a sandbox no one counts; the node's own limits
// still bound it).
func (s *Store) ReleaseStale(ctx context.Context, age time.Duration) (int, error) {
	n, err := s.releaseWhere(ctx, `sandbox_id IS NULL AND reserved_at < now() - make_interval(secs => $1)`, age.Seconds())
	if err != nil {
		return 0, errdefs.Wrap(errdefs.Internal, err, "release stale reservations")
	}
	return n, nil
}

// ReleaseNode releases every sandbox of node: the operator's step for a
// node that left the fleet with its sandboxes (its machine is gone).
func (s *Store) ReleaseNode(ctx context.Context, node string) (int, error) {
	n, err := s.releaseWhere(ctx, `node = $1`, node)
	if err != nil {
		return 0, errdefs.Wrap(errdefs.Internal, err, "release node %s", node)
	}
	return n, nil
}

// Reservations counts the rows of key keyID (tests and operators: it
// equals key_usage's sandboxes).
func (s *Store) Reservations(ctx context.Context, keyID string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM fleet_sandboxes WHERE key_id = $1`, keyID).Scan(&n)
	return n, err
}

// UseLogin records that the gateway web editor login token of nonce,
// valid until expires, is being redeemed: ok is false when any gateway
// redeemed it before (a login token is single-use). Nonces of expired
// tokens are deleted on the way: a token past its expiry is refused by its
// signature's time anyway.
func (s *Store) UseLogin(ctx context.Context, nonce string, expires time.Time) (bool, error) {
	if nonce == "" || len(nonce) > 128 {
		return false, errdefs.Invalidf("nonce: empty or longer than 128 characters")
	}
	var ok bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM ui_logins WHERE expires_at < now()`); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO ui_logins (nonce, expires_at) VALUES ($1, $2) ON CONFLICT DO NOTHING`, nonce, expires)
		ok = err == nil && tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, errdefs.Wrap(errdefs.Internal, err, "redeem a login token")
	}
	return ok, nil
}
