// Package webhooks is the lifecycle webhook service: each tenant registers
// URLs (in SQLite, table webhooks) to which the daemon POSTs its sandboxes'
// lifecycle events, runs and autofix loops that finished, quotas reached
// and the node's drain, signed as the Standard Webhooks specification says
// (sign.go). Every delivery is written to the store (webhook_deliveries)
// before its first attempt and retried with exponential backoff and jitter
// until it succeeds or runs out of attempts (deliver.go), so a delivery
// survives a restart or kill -9 of the daemon: at least once, from the
// moment Announce's event is queued. A webhook whose attempts keep failing
// is disabled, with the reason in its state and the audit log.
//
// Events reach it at one seam: the sandbox manager's Announce
// (pkg/sandbox/lifecycle.go), which the engine wires to Service.Announce.
// REST, MCP and sandboxctl take the service's Webhooks interface directly.
package webhooks

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Webhooks is the webhook operations the front ends serve (REST
// /v1/webhooks, MCP webhook_*, sandboxctl webhooks). Every call acts for
// ctx's principal: a tenant sees and changes its own webhooks only, the
// administrator every one.
type Webhooks interface {
	CreateWebhook(ctx context.Context, req apitypes.WebhookCreateRequest) (*apitypes.Webhook, error)
	ListWebhooks(ctx context.Context) (*apitypes.WebhookList, error)
	GetWebhook(ctx context.Context, id string) (*apitypes.Webhook, error)
	UpdateWebhook(ctx context.Context, req apitypes.WebhookUpdateRequest) (*apitypes.Webhook, error)
	DeleteWebhook(ctx context.Context, id string) error
	// ListDeliveries lists a webhook's deliveries, newest first (limit 0:
	// 50; at most 500).
	ListDeliveries(ctx context.Context, webhookID string, limit int) (*apitypes.WebhookDeliveryList, error)
	// Redeliver queues delivery deliveryID of webhookID again, with its
	// message id unchanged so a receiver can tell it is the same message.
	Redeliver(ctx context.Context, webhookID, deliveryID string) (*apitypes.WebhookDelivery, error)
}

var _ Webhooks = (*Service)(nil)

// Store is what the service needs of the state database: its two tables.
type Store interface {
	PutWebhook(ctx context.Context, w store.Webhook) error
	GetWebhook(ctx context.Context, id string) (*store.Webhook, error)
	ListWebhooks(ctx context.Context) ([]store.Webhook, error)
	UpdateWebhook(ctx context.Context, id string, mutate func(*store.Webhook) error) (*store.Webhook, error)
	DeleteWebhook(ctx context.Context, id string) error
	EnqueueDeliveries(ctx context.Context, ds []store.WebhookDelivery) error
	DueDeliveries(ctx context.Context, now time.Time, limit int) ([]store.WebhookDelivery, error)
	NextDelivery(ctx context.Context) (time.Time, bool, error)
	RecordAttempt(ctx context.Context, id string, o store.AttemptOutcome, disableAfter int, disabledReason string) (bool, error)
	ListDeliveries(ctx context.Context, webhookID string, limit int) ([]store.WebhookDelivery, error)
	GetDelivery(ctx context.Context, id string) (*store.WebhookDelivery, error)
	RequeueDelivery(ctx context.Context, id string, now time.Time) error
	PruneDeliveries(ctx context.Context, cutoff time.Time) (int64, error)
}

// Resolver looks host names up (net.DefaultResolver; tests give their own).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure the service.
type Options struct {
	Store  Store
	Config config.Webhooks
	// Audit records a webhook disabled by its failures (nil: none).
	Audit *audit.Log
	Log   *slog.Logger
	// Resolver is net.DefaultResolver when nil.
	Resolver Resolver
	Now      func() time.Time
}

// Bounds of a webhook's fields.
const (
	DefaultTimeout = 10 * time.Second
	MinTimeout     = time.Second
	MaxTimeout     = 30 * time.Second
	maxURLBytes    = 2048
	maxNameBytes   = 64
	// maxQueued bounds the events Announce holds before they are written
	// to the store; beyond it events are dropped and counted, so a stalled
	// database never grows the daemon's memory without end.
	maxQueued = 10_000
)

// Service owns the webhooks and delivers their events. Security boundary:
// a webhook belongs to the tenant that registered it and receives only
// that tenant's events (the administrator's receive every tenant's); its
// secret leaves the daemon once, in the create's answer, and is never
// logged; its URL may reach a private, loopback or link-local address
// only when webhooks.allow_private or an admin allows it, checked when it
// is registered and again on every dial against the address dialled.
type Service struct {
	store    Store
	cfg      config.Webhooks
	allow    []netip.Prefix
	audit    *audit.Log
	log      *slog.Logger
	resolver Resolver
	now      func() time.Time

	mu      sync.Mutex
	queue   []apitypes.LifecycleEvent
	dropped int
	poke    chan struct{} // wakes the enqueuer
	wake    chan struct{} // wakes the deliverer

	stop context.CancelFunc
	done sync.WaitGroup
}

// New returns the service over opt.Store; Start starts its delivery.
// opt.Config has passed config validation (webhooks.allow_private holds
// CIDRs).
func New(opt Options) *Service {
	s := &Service{store: opt.Store, cfg: opt.Config, audit: opt.Audit, log: opt.Log, resolver: opt.Resolver, now: opt.Now,
		poke: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "webhooks")
	if s.now == nil {
		s.now = time.Now
	}
	if s.resolver == nil {
		s.resolver = defaultResolver{}
	}
	for _, c := range opt.Config.AllowPrivate {
		if p, err := netip.ParsePrefix(c); err == nil {
			s.allow = append(s.allow, p.Masked())
		}
	}
	return s
}

// caller is the principal ctx carries; engine-internal calls (none carry
// one) act as the administrator.
func caller(ctx context.Context) principal.Principal {
	p, ok := principal.From(ctx)
	if !ok {
		return principal.Principal{KeyName: "engine", Admin: true}
	}
	return p
}

func visible(p principal.Principal, w *store.Webhook) bool {
	return p.Admin || w.Tenant == p.Tenant
}

// CreateWebhook registers a webhook for the calling principal and returns
// it with its secret, shown this once.
func (s *Service) CreateWebhook(ctx context.Context, req apitypes.WebhookCreateRequest) (*apitypes.Webhook, error) {
	p := caller(ctx)
	if !p.Admin && p.Tenant == "" {
		// A hook of no tenant receives every tenant's events.
		return nil, errdefs.PermissionDeniedf("webhook: a caller of no tenant that is not the administrator cannot register webhooks")
	}
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	events, err := checkEvents(req.Events)
	if err != nil {
		return nil, err
	}
	timeout, err := checkTimeout(req.TimeoutMS)
	if err != nil {
		return nil, err
	}
	u, err := s.checkURL(ctx, req.URL, p.Admin)
	if err != nil {
		return nil, err
	}
	all, err := s.store.ListWebhooks(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list webhooks")
	}
	n := 0
	for _, w := range all {
		if w.Tenant == p.Tenant {
			n++
		}
	}
	if n >= s.cfg.MaxWebhooks {
		return nil, errdefs.LimitExceededf("webhook: the tenant has %d webhooks, the most webhooks.max_webhooks allows", n)
	}
	secret, err := newSecret()
	if err != nil {
		return nil, err
	}
	id, err := randomID("wh_")
	if err != nil {
		return nil, err
	}
	now := s.now().UTC()
	w := store.Webhook{ID: id, Tenant: p.Tenant, Name: req.Name, URL: u, Secret: secret, Events: events,
		TimeoutMS: timeout, Enabled: req.Enabled == nil || *req.Enabled, AllowPrivate: p.Admin,
		CreatedBy: p.KeyName, CreatedAt: now, UpdatedAt: now}
	if !w.Enabled {
		w.DisabledReason = "disabled by request"
	}
	if err := s.store.PutWebhook(ctx, w); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "record webhook")
	}
	out := toAPI(w)
	out.Secret = secret
	return out, nil
}

// ListWebhooks lists the webhooks the calling principal may see.
func (s *Service) ListWebhooks(ctx context.Context) (*apitypes.WebhookList, error) {
	all, err := s.store.ListWebhooks(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list webhooks")
	}
	p := caller(ctx)
	out := &apitypes.WebhookList{Webhooks: []apitypes.Webhook{}}
	for i := range all {
		if visible(p, &all[i]) {
			out.Webhooks = append(out.Webhooks, *toAPI(all[i]))
		}
	}
	return out, nil
}

// lookup returns webhook id if the calling principal may see it; another
// tenant's is not_found, as a missing one is.
func (s *Service) lookup(ctx context.Context, id string) (*store.Webhook, error) {
	if id == "" {
		return nil, errdefs.Invalidf("webhook_id: required")
	}
	w, err := s.store.GetWebhook(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !visible(caller(ctx), w)) {
		return nil, errdefs.NotFoundf("webhook_id: no webhook %q", id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up webhook")
	}
	return w, nil
}

// GetWebhook returns webhook id (without its secret).
func (s *Service) GetWebhook(ctx context.Context, id string) (*apitypes.Webhook, error) {
	w, err := s.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return toAPI(*w), nil
}

// UpdateWebhook changes the fields req sets. A URL is checked as at
// registration, for the caller making the change.
func (s *Service) UpdateWebhook(ctx context.Context, req apitypes.WebhookUpdateRequest) (*apitypes.Webhook, error) {
	if _, err := s.lookup(ctx, req.ID); err != nil {
		return nil, err
	}
	p := caller(ctx)
	var u string
	var events []string
	var timeout int
	var err error
	if req.Name != nil {
		if err := checkName(*req.Name); err != nil {
			return nil, err
		}
	}
	if req.Events != nil {
		if events, err = checkEvents(*req.Events); err != nil {
			return nil, err
		}
	}
	if req.TimeoutMS != nil {
		if *req.TimeoutMS == 0 {
			return nil, errdefs.Invalidf("timeout_ms: must be %d to %d", MinTimeout.Milliseconds(), MaxTimeout.Milliseconds())
		}
		if timeout, err = checkTimeout(*req.TimeoutMS); err != nil {
			return nil, err
		}
	}
	if req.URL != nil {
		if u, err = s.checkURL(ctx, *req.URL, p.Admin); err != nil {
			return nil, err
		}
	}
	w, err := s.store.UpdateWebhook(ctx, req.ID, func(w *store.Webhook) error {
		if req.Name != nil {
			w.Name = *req.Name
		}
		if req.Events != nil {
			w.Events = events
		}
		if req.TimeoutMS != nil {
			w.TimeoutMS = timeout
		}
		if req.URL != nil {
			w.URL, w.AllowPrivate = u, p.Admin
		}
		if req.Enabled != nil && *req.Enabled != w.Enabled {
			w.Enabled = *req.Enabled
			w.DisabledReason, w.Failures = "", 0
			if !w.Enabled {
				w.DisabledReason = "disabled by request"
			}
		}
		w.UpdatedAt = s.now().UTC()
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.NotFoundf("webhook_id: no webhook %q", req.ID)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "update webhook")
	}
	s.signal(s.wake) // an enabled hook's queued deliveries are due again
	return toAPI(*w), nil
}

// DeleteWebhook removes webhook id and its delivery log.
func (s *Service) DeleteWebhook(ctx context.Context, id string) error {
	if _, err := s.lookup(ctx, id); err != nil {
		return err
	}
	if err := s.store.DeleteWebhook(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return errdefs.Wrap(errdefs.Internal, err, "delete webhook")
	}
	return nil
}

// ListDeliveries lists webhook id's deliveries, newest first.
func (s *Service) ListDeliveries(ctx context.Context, id string, limit int) (*apitypes.WebhookDeliveryList, error) {
	switch {
	case limit < 0 || limit > 500:
		return nil, errdefs.Invalidf("limit: %d is out of range (0 to 500)", limit)
	case limit == 0:
		limit = 50
	}
	if _, err := s.lookup(ctx, id); err != nil {
		return nil, err
	}
	ds, err := s.store.ListDeliveries(ctx, id, limit)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list deliveries")
	}
	out := &apitypes.WebhookDeliveryList{Deliveries: make([]apitypes.WebhookDelivery, 0, len(ds))}
	for _, d := range ds {
		out.Deliveries = append(out.Deliveries, deliveryToAPI(d))
	}
	return out, nil
}

// Redeliver queues delivery deliveryID again, due now.
func (s *Service) Redeliver(ctx context.Context, id, deliveryID string) (*apitypes.WebhookDelivery, error) {
	if _, err := s.lookup(ctx, id); err != nil {
		return nil, err
	}
	if deliveryID == "" {
		return nil, errdefs.Invalidf("delivery_id: required")
	}
	d, err := s.store.GetDelivery(ctx, deliveryID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && d.WebhookID != id) {
		return nil, errdefs.NotFoundf("delivery_id: webhook %s has no delivery %q", id, deliveryID)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up delivery")
	}
	if d.State == apitypes.DeliveryPending {
		return nil, errdefs.FailedPreconditionf("delivery_id: %s is still pending (attempt %d); it is retried on its own", deliveryID, d.Attempts+1)
	}
	if err := s.store.RequeueDelivery(ctx, deliveryID, s.now()); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "requeue delivery")
	}
	s.signal(s.wake)
	d, err = s.store.GetDelivery(ctx, deliveryID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up delivery")
	}
	out := deliveryToAPI(*d)
	return &out, nil
}

func toAPI(w store.Webhook) *apitypes.Webhook {
	state := apitypes.WebhookEnabled
	if !w.Enabled {
		state = apitypes.WebhookDisabled
	}
	events := w.Events
	if len(events) == 0 {
		events = []string{}
	}
	return &apitypes.Webhook{ID: w.ID, Name: w.Name, URL: w.URL, Events: events, State: state,
		DisabledReason: w.DisabledReason, Failures: w.Failures, TimeoutMS: w.TimeoutMS, Tenant: w.Tenant,
		CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
}

func deliveryToAPI(d store.WebhookDelivery) apitypes.WebhookDelivery {
	out := apitypes.WebhookDelivery{ID: d.ID, WebhookID: d.WebhookID, EventType: d.EventType, State: d.State,
		Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError, CreatedAt: d.CreatedAt,
		DeliveredAt: d.DeliveredAt, Payload: d.Payload}
	if d.State == apitypes.DeliveryPending {
		out.NextAttemptAt = d.NextAttemptAt
	}
	return out
}

// checkName validates a webhook's label (optional).
func checkName(name string) error {
	if len(name) > maxNameBytes {
		return errdefs.Invalidf("name: longer than %d bytes", maxNameBytes)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return errdefs.Invalidf("name: holds a control character")
		}
	}
	return nil
}

// checkEvents validates the subscribed types: known ones, each once.
func checkEvents(events []string) ([]string, error) {
	if len(events) > len(apitypes.WebhookEventTypes) {
		return nil, errdefs.Invalidf("events: %d types given; there are %d", len(events), len(apitypes.WebhookEventTypes))
	}
	var out []string
	for i, e := range events {
		if !slices.Contains(apitypes.WebhookEventTypes, e) {
			return nil, errdefs.Invalidf("events[%d]: unknown event type %q (one of %s)", i, e, strings.Join(apitypes.WebhookEventTypes, ", "))
		}
		if slices.Contains(out, e) {
			return nil, errdefs.Invalidf("events[%d]: %q is listed twice", i, e)
		}
		out = append(out, e)
	}
	return out, nil
}

// checkTimeout validates timeout_ms; 0 is the default.
func checkTimeout(ms int) (int, error) {
	if ms == 0 {
		return int(DefaultTimeout.Milliseconds()), nil
	}
	if ms < int(MinTimeout.Milliseconds()) || ms > int(MaxTimeout.Milliseconds()) {
		return 0, errdefs.Invalidf("timeout_ms: %d is out of range (%d to %d)", ms, MinTimeout.Milliseconds(), MaxTimeout.Milliseconds())
	}
	return ms, nil
}

// newSecret makes a signing secret in the Standard Webhooks form:
// whsec_ and the base64 of 32 random bytes.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "random secret")
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b), nil
}

func randomID(prefix string) (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "random id")
	}
	return prefix + hex.EncodeToString(b), nil
}

// signal wakes the goroutine waiting on c, without blocking.
func (s *Service) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
