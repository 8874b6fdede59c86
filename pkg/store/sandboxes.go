package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The end states of a sandbox (docs/SPEC.md, "Sandbox states"). The store knows
// them only to stamp terminated_at and to apply retention; the transition
// table itself belongs to pkg/sandbox.
const (
	stateTerminated = "terminated"
	stateFailed     = "failed"
)

func isEndState(state string) bool { return state == stateTerminated || state == stateFailed }

// SandboxRecord is one row of the sandboxes table.
type SandboxRecord struct {
	ID          string
	State       string
	Language    string
	Image       string // image name
	ImageDigest string
	// Spec is the sandbox's specification (limits, env, network, labels) as
	// the engine encodes it; the store only checks that it is valid JSON.
	// nil is stored as SQL NULL and read back as nil.
	Spec          json.RawMessage
	CgroupPath    string
	InitPID       int
	InitStartTime uint64 // start time of InitPID in clock ticks since boot, to detect PID reuse
	CreatedAt     time.Time
	UpdatedAt     time.Time
	LastActiveAt  time.Time
	// TerminatedAt is when the sandbox reached an end state (terminated or
	// failed); nil while it lives.
	TerminatedAt      *time.Time
	TerminationReason string
}

// Event is one state change of a sandbox. The creation event has From "".
type Event struct {
	ID        int64 // increasing, never reused
	SandboxID string
	At        time.Time
	From      string
	To        string
	Reason    string
}

// ListFilter selects sandboxes for ListSandboxes.
type ListFilter struct {
	// States, when not empty, selects exactly the sandboxes in these states,
	// and IncludeTerminated is ignored.
	States []string
	// IncludeTerminated, when States is empty, includes sandboxes in an end
	// state (terminated, failed); otherwise only live ones are listed.
	IncludeTerminated bool
}

// StateMismatchError is returned by Transition when the sandbox is not in the
// state the caller expected. errors.Is(err, ErrStateMismatch) holds.
type StateMismatchError struct {
	ID       string
	Expected string // the from state given to Transition
	Actual   string // the state in the database
}

func (e *StateMismatchError) Error() string {
	return fmt.Sprintf("sandbox %s is %s, not %s", e.ID, e.Actual, e.Expected)
}

// Is makes errors.Is(err, ErrStateMismatch) true.
func (e *StateMismatchError) Is(target error) bool { return target == ErrStateMismatch }

// sandboxColumns is the column list every query reads and scanSandbox decodes.
const sandboxColumns = `id, state, language, image, image_digest, spec, cgroup_path, init_pid,
	init_start_time, created_at, updated_at, last_active_at, terminated_at, termination_reason`

// InsertSandbox records a new sandbox and its creation event ("" -> r.State)
// in one transaction. Zero CreatedAt is set to now, and zero UpdatedAt and
// LastActiveAt to CreatedAt, in r itself. An id already in use is an error
// wrapping ErrAlreadyExists.
func (s *Store) InsertSandbox(ctx context.Context, r *SandboxRecord) error {
	if r.ID == "" || r.State == "" {
		return errors.New("store: insert sandbox: id and state are required")
	}
	if r.Spec != nil && !json.Valid(r.Spec) {
		return fmt.Errorf("store: insert sandbox %s: spec is not valid JSON", r.ID)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now().UTC()
	}
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = r.CreatedAt
	}
	if r.LastActiveAt.IsZero() {
		r.LastActiveAt = r.CreatedAt
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		// Checked inside the write transaction, so no other insert can slip
		// in between; clearer than decoding SQLite's constraint error codes.
		var exists bool
		if err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)", r.ID).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return ErrAlreadyExists
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, sandboxValues(r)...); err != nil {
			return err
		}
		return insertEvent(ctx, tx, r.ID, r.CreatedAt, "", r.State, "created")
	})
	if err != nil {
		return fmt.Errorf("store: insert sandbox %s: %w", r.ID, err)
	}
	return nil
}

// GetSandbox returns the sandbox with the given id, or an error wrapping
// ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, id string) (*SandboxRecord, error) {
	r, err := getSandbox(ctx, s.r, id)
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %s: %w", id, err)
	}
	return r, nil
}

// ListSandboxes returns the sandboxes f selects, oldest first.
func (s *Store) ListSandboxes(ctx context.Context, f ListFilter) ([]*SandboxRecord, error) {
	var (
		where string
		args  []any
	)
	switch {
	case len(f.States) > 0:
		where, args = "WHERE state IN ("+placeholders(len(f.States))+")", stringArgs(f.States)
	case !f.IncludeTerminated:
		where, args = "WHERE state NOT IN (?, ?)", []any{stateTerminated, stateFailed}
	}
	return queryAll(ctx, s.r, "list sandboxes", scanSandbox,
		"SELECT "+sandboxColumns+" FROM sandboxes "+where+" ORDER BY created_at, id", args...)
}

// Transition atomically moves sandbox id from state from to state to: if
// its current state is not from it changes nothing and returns a
// *StateMismatchError (errors.Is(err, ErrStateMismatch)) naming the actual
// state. Otherwise it sets the state and UpdatedAt, sets TerminatedAt when to
// is an end state (terminated, failed) and it was not set yet, applies mutate
// (optional) for other fields, and records the event, all in one
// transaction. mutate must not change ID or State. Which transitions are
// legal is the caller's business.
func (s *Store) Transition(ctx context.Context, id, from, to, reason string, mutate func(*SandboxRecord)) error {
	if to == "" {
		return fmt.Errorf("store: transition sandbox %s: empty target state", id)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		// Read-modify-write is race-free here: the transaction began with
		// BEGIN IMMEDIATE and holds the database's write lock throughout.
		r, err := getSandbox(ctx, tx, id)
		if err != nil {
			return err
		}
		if r.State != from {
			return &StateMismatchError{ID: id, Expected: from, Actual: r.State}
		}
		now := time.Now().UTC()
		r.State, r.UpdatedAt = to, now
		if isEndState(to) && r.TerminatedAt == nil {
			r.TerminatedAt = &now
		}
		if err := apply(r, mutate); err != nil {
			return err
		}
		if err := updateSandbox(ctx, tx, r); err != nil {
			return err
		}
		return insertEvent(ctx, tx, id, now, from, to, reason)
	})
	if err != nil {
		return fmt.Errorf("store: transition sandbox %s %s -> %s: %w", id, from, to, err)
	}
	return nil
}

// TransitionActive is Transition for the state changes of a command's
// start and end (ready <-> running), which change no column but the state,
// UpdatedAt and, when lastActive is not zero, LastActiveAt: one UPDATE
// that is itself the compare-and-set and the event row, in one
// transaction like Transition's, by statements prepared once. Transition
// reads and rewrites the whole row (the spec's JSON included) and compiles
// its statements on every call. An end state (terminated, failed) is
// refused: it stamps TerminatedAt and its reason, which only Transition
// writes.
func (s *Store) TransitionActive(ctx context.Context, id, from, to, reason string, lastActive time.Time) error {
	if to == "" || isEndState(to) {
		return fmt.Errorf("store: transition sandbox %s: %q is not a state TransitionActive sets", id, to)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		now := time.Now().UTC()
		res, err := tx.StmtContext(ctx, s.setState).ExecContext(ctx, to, nanos(now), nanos(lastActive), id, from)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			// No row in state from: say which state it is in, or that
			// there is none.
			var actual string
			err := tx.QueryRowContext(ctx, "SELECT state FROM sandboxes WHERE id = ?", id).Scan(&actual)
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			if err != nil {
				return err
			}
			return &StateMismatchError{ID: id, Expected: from, Actual: actual}
		}
		_, err = tx.StmtContext(ctx, s.addEvent).ExecContext(ctx, id, nanos(now), from, to, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: transition sandbox %s %s -> %s: %w", id, from, to, err)
	}
	return nil
}

// prepare compiles the writer's prepared statements (Store.setState,
// Store.addEvent).
func (s *Store) prepare(ctx context.Context) (err error) {
	// A zero lastActive (nanos 0) keeps the column.
	if s.setState, err = s.w.PrepareContext(ctx, `UPDATE sandboxes SET state = ?1, updated_at = ?2,
		last_active_at = CASE WHEN ?3 = 0 THEN last_active_at ELSE ?3 END WHERE id = ?4 AND state = ?5`); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if s.addEvent, err = s.w.PrepareContext(ctx, insertEventSQL); err != nil {
		s.setState.Close()
		return fmt.Errorf("prepare: %w", err)
	}
	return nil
}

// UpdateSandbox applies mutate to sandbox id and saves the result with a new
// UpdatedAt, in one transaction. It is for fields other than the state (init
// pid, last activity); mutate must not change ID or State, which only
// Transition changes, so that every state change has its event. A missing
// sandbox is an error wrapping ErrNotFound.
func (s *Store) UpdateSandbox(ctx context.Context, id string, mutate func(*SandboxRecord)) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		r, err := getSandbox(ctx, tx, id)
		if err != nil {
			return err
		}
		r.UpdatedAt = time.Now().UTC()
		if err := apply(r, mutate); err != nil {
			return err
		}
		return updateSandbox(ctx, tx, r)
	})
	if err != nil {
		return fmt.Errorf("store: update sandbox %s: %w", id, err)
	}
	return nil
}

// Events returns up to limit events with ids greater than sinceID, oldest
// first: those of sandboxID, or of every sandbox when sandboxID is "". A
// limit of 0 or less means no limit. Pass the last id received as sinceID to
// continue where a previous call stopped.
func (s *Store) Events(ctx context.Context, sandboxID string, sinceID int64, limit int) ([]Event, error) {
	q := "SELECT id, sandbox_id, at, from_state, to_state, reason FROM sandbox_events WHERE id > ?"
	args := []any{sinceID}
	if sandboxID != "" {
		q += " AND sandbox_id = ?"
		args = append(args, sandboxID)
	}
	q += " ORDER BY id"
	if limit > 0 {
		q += " LIMIT ?"
		args = append(args, limit)
	}
	return queryAll(ctx, s.r, "events", func(row rowScanner) (Event, error) {
		var (
			e  Event
			at int64
		)
		err := row.Scan(&e.ID, &e.SandboxID, &at, &e.From, &e.To, &e.Reason)
		e.At = fromNanos(at)
		return e, err
	}, q, args...)
}

// CountSandboxes returns how many sandboxes are in any of states, or how
// many there are in all when no state is given.
func (s *Store) CountSandboxes(ctx context.Context, states ...string) (int, error) {
	q, args := "SELECT COUNT(*) FROM sandboxes", []any(nil)
	if len(states) > 0 {
		q, args = q+" WHERE state IN ("+placeholders(len(states))+")", stringArgs(states)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count sandboxes: %w", err)
	}
	return n, nil
}

// DeleteTerminatedBefore deletes the sandboxes that reached an end state
// before t, with their events, and returns how many it deleted. It is the
// retention policy's tool; live sandboxes are never deleted.
func (s *Store) DeleteTerminatedBefore(ctx context.Context, t time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes
			WHERE state IN (?, ?) AND terminated_at IS NOT NULL AND terminated_at < ?`,
			stateTerminated, stateFailed, nanos(t))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: delete sandboxes terminated before %s: %w", t.Format(time.RFC3339), err)
	}
	return int(n), nil
}

// apply runs mutate, if any, on r and checks that it left the identity and
// the state alone.
func apply(r *SandboxRecord, mutate func(*SandboxRecord)) error {
	if mutate == nil {
		return nil
	}
	id, state := r.ID, r.State
	mutate(r)
	if r.ID != id || r.State != state {
		return errors.New("mutate changed the sandbox's id or state")
	}
	if r.Spec != nil && !json.Valid(r.Spec) {
		return errors.New("spec is not valid JSON")
	}
	return nil
}

// querier is what getSandbox needs from a *sql.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getSandbox(ctx context.Context, q querier, id string) (*SandboxRecord, error) {
	r, err := scanSandbox(q.QueryRowContext(ctx, "SELECT "+sandboxColumns+" FROM sandboxes WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return r, err
}

func updateSandbox(ctx context.Context, tx *sql.Tx, r *SandboxRecord) error {
	v := sandboxValues(r)
	// Every column but id, which goes last for the WHERE clause.
	_, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, language = ?, image = ?, image_digest = ?,
		spec = ?, cgroup_path = ?, init_pid = ?, init_start_time = ?, created_at = ?, updated_at = ?,
		last_active_at = ?, terminated_at = ?, termination_reason = ? WHERE id = ?`, append(v[1:], v[0])...)
	return err
}

const insertEventSQL = "INSERT INTO sandbox_events (sandbox_id, at, from_state, to_state, reason) VALUES (?, ?, ?, ?, ?)"

func insertEvent(ctx context.Context, tx *sql.Tx, id string, at time.Time, from, to, reason string) error {
	_, err := tx.ExecContext(ctx, insertEventSQL, id, nanos(at), from, to, reason)
	return err
}

// sandboxValues returns r's column values in sandboxColumns order.
func sandboxValues(r *SandboxRecord) []any {
	var spec, terminated any // NULL unless set
	if r.Spec != nil {
		// As text: json_valid would read a BLOB as SQLite's binary JSONB.
		spec = string(r.Spec)
	}
	if r.TerminatedAt != nil {
		terminated = nanos(*r.TerminatedAt)
	}
	return []any{r.ID, r.State, r.Language, r.Image, r.ImageDigest, spec, r.CgroupPath, r.InitPID,
		int64(r.InitStartTime), nanos(r.CreatedAt), nanos(r.UpdatedAt), nanos(r.LastActiveAt), terminated,
		r.TerminationReason}
}

// scanSandbox decodes one row of sandboxColumns.
func scanSandbox(row rowScanner) (*SandboxRecord, error) {
	var (
		r                            SandboxRecord
		spec                         []byte
		startTime                    int64
		created, updated, lastActive int64
		terminated                   sql.NullInt64
	)
	if err := row.Scan(&r.ID, &r.State, &r.Language, &r.Image, &r.ImageDigest, &spec, &r.CgroupPath, &r.InitPID,
		&startTime, &created, &updated, &lastActive, &terminated, &r.TerminationReason); err != nil {
		return nil, err
	}
	if spec != nil {
		r.Spec = json.RawMessage(spec)
	}
	r.InitStartTime = uint64(startTime)
	r.CreatedAt, r.UpdatedAt, r.LastActiveAt = fromNanos(created), fromNanos(updated), fromNanos(lastActive)
	if terminated.Valid {
		t := fromNanos(terminated.Int64)
		r.TerminatedAt = &t
	}
	return &r, nil
}

// placeholders returns "?, ?, ?" for n parameters.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func stringArgs(ss []string) []any {
	args := make([]any, len(ss))
	for i, s := range ss {
		args[i] = s
	}
	return args
}
