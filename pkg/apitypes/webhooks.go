package apitypes

import (
	"encoding/json"
	"time"
)

// Lifecycle event types a webhook may subscribe to (docs/webhooks.md). The
// sandbox ones are E2B's names where E2B has the event
// (sandbox.lifecycle.created, .paused, .resumed, .killed); ready and
// failed, and the run, autofix, quota and node events, are ours.
const (
	EventSandboxCreated    = "sandbox.lifecycle.created"
	EventSandboxReady      = "sandbox.lifecycle.ready"
	EventSandboxPaused     = "sandbox.lifecycle.paused"
	EventSandboxResumed    = "sandbox.lifecycle.resumed"
	EventSandboxTerminated = "sandbox.lifecycle.killed"
	EventSandboxFailed     = "sandbox.lifecycle.failed"
	EventRunFinished       = "run.finished"
	EventAutofixFinished   = "autofix.finished"
	EventQuotaReached      = "quota.reached"
	EventNodeDrained       = "node.drained"
)

// WebhookEventTypes are the event types, in the order documented.
var WebhookEventTypes = []string{
	EventSandboxCreated, EventSandboxReady, EventSandboxPaused, EventSandboxResumed,
	EventSandboxTerminated, EventSandboxFailed, EventRunFinished, EventAutofixFinished,
	EventQuotaReached, EventNodeDrained,
}

// LifecycleEvent is one lifecycle event as it happens in the daemon (the
// sandbox manager's Announce), before a webhook delivers it.
type LifecycleEvent struct {
	Type      string
	Time      time.Time
	SandboxID string
	// Tenant owns what the event is about ("" for the administrator's
	// sandboxes and for node events).
	Tenant   string
	Template string
	Image    string
	// Cause is why a sandbox ended (terminated, failed).
	Cause string
	// Data is the event's own fields (a run's id and exit code, ...).
	Data map[string]any
}

// WebhookPayload is the JSON body of a delivery. Its fields are E2B's
// lifecycle webhook payload's (version, id, type, eventData, sandboxId,
// sandboxTeamId, sandboxTemplateId, timestamp), so a receiver written for
// E2B reads ours; eventData holds the fields of events E2B does not have.
type WebhookPayload struct {
	Version           string         `json:"version"`
	ID                string         `json:"id"`
	Type              string         `json:"type"`
	EventData         map[string]any `json:"eventData"`
	SandboxID         string         `json:"sandboxId,omitempty"`
	SandboxTeamID     string         `json:"sandboxTeamId,omitempty"`
	SandboxTemplateID string         `json:"sandboxTemplateId,omitempty"`
	Timestamp         time.Time      `json:"timestamp"`
}

// Webhook states.
const (
	WebhookEnabled  = "enabled"
	WebhookDisabled = "disabled"
)

// Webhook is a registered webhook (webhook_get, GET /v1/webhooks/{id}).
type Webhook struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	URL    string   `json:"url"`
	Events []string `json:"events"`
	// State is enabled or disabled; DisabledReason says why a disabled
	// hook is (by request, or the failures that disabled it).
	State          string `json:"state"`
	DisabledReason string `json:"disabled_reason,omitempty"`
	// Failures is the attempts that failed in a row since the last
	// success.
	Failures  int       `json:"failures"`
	TimeoutMS int       `json:"timeout_ms"`
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Secret (whsec_<base64>) is in the answer to the create only: it is
	// never shown again.
	Secret string `json:"secret,omitempty"`
}

// WebhookCreateRequest registers a webhook (webhook_create,
// POST /v1/webhooks).
type WebhookCreateRequest struct {
	Name string `json:"name,omitempty"`
	URL  string `json:"url"`
	// Events to deliver; empty: every type.
	Events []string `json:"events,omitempty"`
	// TimeoutMS bounds one delivery attempt (1000 to 30000; default 10000).
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// Enabled: false registers it disabled (default true).
	Enabled *bool `json:"enabled,omitempty"`
}

// WebhookUpdateRequest changes the fields it sets (webhook_update,
// PATCH /v1/webhooks/{id}). Enabling a disabled hook clears its failures.
type WebhookUpdateRequest struct {
	ID        string    `json:"webhook_id"`
	Name      *string   `json:"name,omitempty"`
	URL       *string   `json:"url,omitempty"`
	Events    *[]string `json:"events,omitempty"`
	TimeoutMS *int      `json:"timeout_ms,omitempty"`
	Enabled   *bool     `json:"enabled,omitempty"`
}

// WebhookList is the body of GET /v1/webhooks.
type WebhookList struct {
	Webhooks []Webhook `json:"webhooks"`
}

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// WebhookDelivery is one event's delivery to one webhook: its message id
// (the webhook-id header, the same on every attempt), and how its
// attempts went.
type WebhookDelivery struct {
	ID            string    `json:"id"`
	WebhookID     string    `json:"webhook_id"`
	EventType     string    `json:"event_type"`
	State         string    `json:"state"`
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	// LastStatus is the HTTP status of the last attempt (0: no answer);
	// LastError what went wrong with it.
	LastStatus  int             `json:"last_status,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	DeliveredAt time.Time       `json:"delivered_at,omitzero"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

// WebhookDeliveryList is the body of GET /v1/webhooks/{id}/deliveries.
type WebhookDeliveryList struct {
	Deliveries []WebhookDelivery `json:"deliveries"`
}
