package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Webhook is a registered lifecycle webhook (pkg/services/webhooks).
type Webhook struct {
	ID     string
	Tenant string
	Name   string
	URL    string
	// Secret is the signing secret as issued (whsec_<base64>).
	Secret         string
	Events         []string // empty: every type
	TimeoutMS      int
	Enabled        bool
	DisabledReason string
	Failures       int
	// AllowPrivate: an admin registered the URL, so it may resolve to a
	// private, loopback or link-local address.
	AllowPrivate bool
	CreatedBy    string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// WebhookDelivery is one row of the delivery queue and log.
type WebhookDelivery struct {
	ID            string
	WebhookID     string
	EventType     string
	Payload       []byte
	State         string // pending | delivered | failed
	Attempts      int
	NextAttemptAt time.Time
	LastStatus    int
	LastError     string
	CreatedAt     time.Time
	DeliveredAt   time.Time
}

const webhookColumns = "id, tenant, name, url, secret, events, timeout_ms, enabled, disabled_reason, failures, allow_private, created_by, created_at, updated_at"

func scanWebhook(r rowScanner) (Webhook, error) {
	var w Webhook
	var events string
	var created, updated int64
	err := r.Scan(&w.ID, &w.Tenant, &w.Name, &w.URL, &w.Secret, &events, &w.TimeoutMS, &w.Enabled,
		&w.DisabledReason, &w.Failures, &w.AllowPrivate, &w.CreatedBy, &created, &updated)
	if events != "" {
		w.Events = strings.Split(events, ",")
	}
	w.CreatedAt, w.UpdatedAt = fromNanos(created), fromNanos(updated)
	return w, err
}

// PutWebhook records a new webhook.
func (s *Store) PutWebhook(ctx context.Context, w Webhook) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO webhooks ("+webhookColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			w.ID, w.Tenant, w.Name, w.URL, w.Secret, strings.Join(w.Events, ","), w.TimeoutMS, w.Enabled,
			w.DisabledReason, w.Failures, w.AllowPrivate, w.CreatedBy, nanos(w.CreatedAt), nanos(w.UpdatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("store: record webhook %s: %w", w.ID, err)
	}
	return nil
}

// GetWebhook returns webhook id, or an error wrapping ErrNotFound.
func (s *Store) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	w, err := scanWebhook(s.r.QueryRowContext(ctx, "SELECT "+webhookColumns+" FROM webhooks WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: webhook %s: %w", id, err)
	}
	return &w, nil
}

// ListWebhooks lists the webhooks, oldest first.
func (s *Store) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	return queryAll(ctx, s.r, "list webhooks", scanWebhook,
		"SELECT "+webhookColumns+" FROM webhooks ORDER BY created_at, id")
}

// UpdateWebhook applies mutate to webhook id in one transaction; a missing
// row is ErrNotFound. It returns the row as written.
func (s *Store) UpdateWebhook(ctx context.Context, id string, mutate func(*Webhook) error) (*Webhook, error) {
	var out Webhook
	err := s.write(ctx, func(tx *sql.Tx) error {
		w, err := scanWebhook(tx.QueryRowContext(ctx, "SELECT "+webhookColumns+" FROM webhooks WHERE id = ?", id))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := mutate(&w); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE webhooks SET name = ?, url = ?, events = ?, timeout_ms = ?, enabled = ?,
disabled_reason = ?, failures = ?, allow_private = ?, updated_at = ? WHERE id = ?`,
			w.Name, w.URL, strings.Join(w.Events, ","), w.TimeoutMS, w.Enabled, w.DisabledReason, w.Failures,
			w.AllowPrivate, nanos(w.UpdatedAt), id)
		out = w
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: update webhook %s: %w", id, err)
	}
	return &out, nil
}

// DeleteWebhook removes webhook id and its deliveries; a missing row is
// ErrNotFound.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM webhooks WHERE id = ?", id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		_, err = tx.ExecContext(ctx, "DELETE FROM webhook_deliveries WHERE webhook_id = ?", id)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: delete webhook %s: %w", id, err)
	}
	return nil
}

const deliveryColumns = "id, webhook_id, event_type, payload, state, attempts, next_attempt_at, last_status, last_error, created_at, delivered_at"

func scanDelivery(r rowScanner) (WebhookDelivery, error) {
	var d WebhookDelivery
	var next, created, delivered int64
	err := r.Scan(&d.ID, &d.WebhookID, &d.EventType, &d.Payload, &d.State, &d.Attempts, &next,
		&d.LastStatus, &d.LastError, &created, &delivered)
	d.NextAttemptAt, d.CreatedAt, d.DeliveredAt = fromNanos(next), fromNanos(created), fromNanos(delivered)
	return d, err
}

// EnqueueDeliveries records deliveries (state pending) in one transaction:
// once it returns they survive a crash.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []WebhookDelivery) error {
	if len(ds) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		for _, d := range ds {
			if _, err := tx.ExecContext(ctx, "INSERT INTO webhook_deliveries ("+deliveryColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
				d.ID, d.WebhookID, d.EventType, d.Payload, d.State, d.Attempts, nanos(d.NextAttemptAt),
				d.LastStatus, d.LastError, nanos(d.CreatedAt), nanos(d.DeliveredAt)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: enqueue %d webhook deliveries: %w", len(ds), err)
	}
	return nil
}

// DueDeliveries returns up to limit pending deliveries of enabled
// webhooks whose next attempt is due at now, the most overdue first.
func (s *Store) DueDeliveries(ctx context.Context, now time.Time, limit int) ([]WebhookDelivery, error) {
	return queryAll(ctx, s.r, "due webhook deliveries", scanDelivery,
		`SELECT d.id, d.webhook_id, d.event_type, d.payload, d.state, d.attempts, d.next_attempt_at, d.last_status,
d.last_error, d.created_at, d.delivered_at FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
WHERE d.state = 'pending' AND w.enabled = 1 AND d.next_attempt_at <= ? ORDER BY d.next_attempt_at, d.id LIMIT ?`,
		nanos(now), limit)
}

// NextDelivery returns when the earliest pending delivery of an enabled
// webhook is due; ok is false when none is pending.
func (s *Store) NextDelivery(ctx context.Context) (at time.Time, ok bool, err error) {
	var n sql.NullInt64
	err = s.r.QueryRowContext(ctx, `SELECT MIN(d.next_attempt_at) FROM webhook_deliveries d
JOIN webhooks w ON w.id = d.webhook_id WHERE d.state = 'pending' AND w.enabled = 1`).Scan(&n)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("store: next webhook delivery: %w", err)
	}
	return fromNanos(n.Int64), n.Valid, nil
}

// AttemptOutcome is what one delivery attempt came to.
type AttemptOutcome struct {
	OK     bool
	Status int
	Error  string
	At     time.Time
	// Next is when to try again; zero: the delivery is given up (failed).
	Next time.Time
}

// RecordAttempt records one attempt of delivery id and its webhook's
// failures in one transaction. A failure that makes the webhook's
// failures in a row reach disableAfter disables it with disabledReason;
// disabled says whether this attempt did.
func (s *Store) RecordAttempt(ctx context.Context, id string, o AttemptOutcome, disableAfter int, disabledReason string) (disabled bool, err error) {
	err = s.write(ctx, func(tx *sql.Tx) error {
		var hook string
		if err := tx.QueryRowContext(ctx, "SELECT webhook_id FROM webhook_deliveries WHERE id = ?", id).Scan(&hook); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound // its webhook was deleted meanwhile
			}
			return err
		}
		state, delivered, next := "pending", int64(0), nanos(o.Next)
		switch {
		case o.OK:
			state, delivered, next = "delivered", nanos(o.At), 0
		case o.Next.IsZero():
			state = "failed"
		}
		if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1,
next_attempt_at = ?, last_status = ?, last_error = ?, delivered_at = ? WHERE id = ?`,
			state, next, o.Status, o.Error, delivered, id); err != nil {
			return err
		}
		var enabled bool
		var failures int
		if err := tx.QueryRowContext(ctx, "SELECT enabled, failures FROM webhooks WHERE id = ?", hook).Scan(&enabled, &failures); err != nil {
			return err
		}
		reason := ""
		if o.OK {
			failures = 0
		} else if failures++; enabled && failures >= disableAfter {
			enabled, disabled, reason = false, true, disabledReason
		}
		if !disabled {
			_, err := tx.ExecContext(ctx, "UPDATE webhooks SET failures = ? WHERE id = ?", failures, hook)
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE webhooks SET failures = ?, enabled = 0, disabled_reason = ?, updated_at = ? WHERE id = ?",
			failures, reason, nanos(o.At), hook)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: record webhook delivery %s: %w", id, err)
	}
	return disabled, nil
}

// ListDeliveries lists up to limit deliveries of webhook id, newest first.
func (s *Store) ListDeliveries(ctx context.Context, webhookID string, limit int) ([]WebhookDelivery, error) {
	return queryAll(ctx, s.r, "list webhook deliveries", scanDelivery,
		"SELECT "+deliveryColumns+" FROM webhook_deliveries WHERE webhook_id = ? ORDER BY created_at DESC, id DESC LIMIT ?",
		webhookID, limit)
}

// GetDelivery returns delivery id, or an error wrapping ErrNotFound.
func (s *Store) GetDelivery(ctx context.Context, id string) (*WebhookDelivery, error) {
	d, err := scanDelivery(s.r.QueryRowContext(ctx, "SELECT "+deliveryColumns+" FROM webhook_deliveries WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: webhook delivery %s: %w", id, err)
	}
	return &d, nil
}

// RequeueDelivery makes delivery id pending again, due at now, with a
// fresh count of attempts (a redelivery).
func (s *Store) RequeueDelivery(ctx context.Context, id string, now time.Time) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_at = ?, delivered_at = 0 WHERE id = ?",
			nanos(now), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: redeliver %s: %w", id, err)
	}
	return nil
}

// PruneDeliveries deletes the deliveries made before cutoff that are no
// longer pending, and returns how many.
func (s *Store) PruneDeliveries(ctx context.Context, cutoff time.Time) (int64, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM webhook_deliveries WHERE state != 'pending' AND created_at < ?", nanos(cutoff))
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: prune webhook deliveries: %w", err)
	}
	return n, nil
}
