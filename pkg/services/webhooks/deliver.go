package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// Delivery: Announce queues an event in memory (it never blocks: it runs
// under the sandbox's lock); the enqueuer writes one delivery row per
// webhook that wants the event, before any attempt; the deliverer takes
// the rows that are due, a few at a time, and records each attempt's
// outcome. A daemon killed between an attempt and its record makes the
// attempt again after the restart: at least once, never at most once.

const (
	// workers bounds the attempts in flight: a slow receiver holds one
	// for at most its timeout.
	workers = 4
	// batch is how many due rows one look at the queue takes.
	batch = 32
	// maxResponse is how much of a receiver's answer is read (and thrown
	// away) so its connection closes cleanly.
	maxResponse = 64 << 10
	// pruneEvery is how often the delivery log is cut to webhooks.max_age.
	pruneEvery = time.Hour
	// payloadVersion is E2B's lifecycle payload version whose fields the
	// payload has.
	payloadVersion = "v2"
)

// Start starts the enqueuer and the deliverer, which pick up the
// deliveries a previous run of the daemon left pending.
func (s *Service) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.done.Add(2)
	go func() { defer s.done.Done(); s.enqueueLoop(ctx) }()
	go func() { defer s.done.Done(); s.deliverLoop(ctx) }()
	s.signal(s.wake)
}

// Stop stops delivery and waits for attempts in flight (at most their
// timeout). Events announced and not yet written are lost, like those of a
// crash; written deliveries are made by the next daemon.
func (s *Service) Stop() {
	if s.stop == nil {
		return
	}
	s.stop()
	s.done.Wait()
}

// Announce queues ev for the webhooks that want it. It never blocks.
func (s *Service) Announce(ev apitypes.LifecycleEvent) {
	s.mu.Lock()
	if len(s.queue) >= maxQueued {
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	s.signal(s.poke)
}

func (s *Service) enqueueLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.poke:
		}
		s.mu.Lock()
		evs, dropped := s.queue, s.dropped
		s.queue, s.dropped = nil, 0
		s.mu.Unlock()
		if dropped > 0 {
			s.log.Error("webhook events dropped: the queue was full", "dropped", dropped)
		}
		if len(evs) == 0 {
			continue
		}
		if err := s.enqueue(ctx, evs); err != nil {
			s.log.Error("queue webhook deliveries", "events", len(evs), "err", err)
			continue
		}
		s.signal(s.wake)
	}
}

// wants says whether webhook w receives ev: enabled, subscribed to its
// type, and the event is of its tenant (the administrator's hooks receive
// every tenant's; the node's drain concerns every tenant).
func wants(w *store.Webhook, ev *apitypes.LifecycleEvent) bool {
	if !w.Enabled || (len(w.Events) > 0 && !slices.Contains(w.Events, ev.Type)) {
		return false
	}
	return w.Tenant == "" || w.Tenant == ev.Tenant || ev.Type == apitypes.EventNodeDrained
}

// enqueue writes the deliveries of evs in one transaction.
func (s *Service) enqueue(ctx context.Context, evs []apitypes.LifecycleEvent) error {
	hooks, err := s.store.ListWebhooks(ctx)
	if err != nil {
		return err
	}
	now := s.now().UTC()
	var ds []store.WebhookDelivery
	for i := range evs {
		ev := &evs[i]
		var body []byte
		for j := range hooks {
			if !wants(&hooks[j], ev) {
				continue
			}
			if body == nil {
				if body, err = payload(ev); err != nil {
					return err
				}
			}
			id, err := randomID("msg_")
			if err != nil {
				return err
			}
			ds = append(ds, store.WebhookDelivery{ID: id, WebhookID: hooks[j].ID, EventType: ev.Type, Payload: body,
				State: apitypes.DeliveryPending, NextAttemptAt: now, CreatedAt: now})
		}
	}
	return s.store.EnqueueDeliveries(ctx, ds)
}

// payload is ev's JSON body, in the fields of E2B's lifecycle payload.
func payload(ev *apitypes.LifecycleEvent) ([]byte, error) {
	id, err := randomID("evt_")
	if err != nil {
		return nil, err
	}
	data := map[string]any{}
	for k, v := range ev.Data {
		data[k] = v
	}
	if ev.Cause != "" {
		data["cause"] = ev.Cause
	}
	if ev.Image != "" {
		data["image"] = ev.Image
	}
	t := ev.Time
	if t.IsZero() {
		t = time.Now()
	}
	p := apitypes.WebhookPayload{Version: payloadVersion, ID: id, Type: ev.Type, EventData: data,
		SandboxID: ev.SandboxID, SandboxTeamID: ev.Tenant, SandboxTemplateID: ev.Template, Timestamp: t.UTC()}
	return json.Marshal(p)
}

func (s *Service) deliverLoop(ctx context.Context) {
	var (
		mu       sync.Mutex
		inflight = map[string]bool{}
		sem      = make(chan struct{}, workers)
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	lastPrune := time.Time{}
	for {
		if now := s.now(); now.Sub(lastPrune) >= pruneEvery {
			lastPrune = now
			if n, err := s.store.PruneDeliveries(ctx, now.Add(-s.cfg.MaxAge.D())); err != nil {
				s.log.Warn("prune webhook deliveries", "err", err)
			} else if n > 0 {
				s.log.Info("pruned webhook deliveries", "deleted", n)
			}
		}
		due, err := s.store.DueDeliveries(ctx, s.now(), batch)
		if err != nil && ctx.Err() == nil {
			s.log.Error("read webhook deliveries", "err", err)
		}
		for _, d := range due {
			mu.Lock()
			busy := inflight[d.ID]
			if !busy {
				inflight[d.ID] = true
			}
			mu.Unlock()
			if busy {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.attempt(ctx, d)
				mu.Lock()
				delete(inflight, d.ID)
				mu.Unlock()
				<-sem
				s.signal(s.wake)
			}()
		}
		wait := time.Minute
		if at, ok, err := s.store.NextDelivery(ctx); err == nil && ok {
			// Due rows still in flight: their attempt's end wakes us.
			wait = min(max(time.Until(at), 0), wait)
			if wait == 0 {
				wait = time.Second
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// backoff is the delay after the n-th failed attempt (n from 1):
// retry_base doubled n-1 times, capped at retry_max, then drawn at
// random from its upper half, so receivers that fail together are not
// retried together.
func backoff(base, maxDelay time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return d/2 + rand.N(d/2+1)
}

// attempt makes one attempt of d and records its outcome.
func (s *Service) attempt(ctx context.Context, d store.WebhookDelivery) {
	w, err := s.store.GetWebhook(ctx, d.WebhookID)
	if err != nil || !w.Enabled {
		return // deleted or disabled meanwhile: nothing to record
	}
	status, aerr := s.post(ctx, w, d)
	if ctx.Err() != nil {
		return // the daemon is stopping: the next one makes this attempt
	}
	now := s.now().UTC()
	o := store.AttemptOutcome{OK: aerr == nil, Status: status, At: now}
	if aerr != nil {
		o.Error = aerr.Error()
		if n := d.Attempts + 1; n < s.cfg.MaxAttempts {
			o.Next = now.Add(backoff(s.cfg.RetryBase.D(), s.cfg.RetryMax.D(), n))
		}
	}
	reason := fmt.Sprintf("%d delivery attempts in a row failed (webhooks.disable_after); the last: %s", s.cfg.DisableAfter, o.Error)
	disabled, err := s.store.RecordAttempt(ctx, d.ID, o, s.cfg.DisableAfter, reason)
	if errors.Is(err, store.ErrNotFound) {
		return
	}
	if err != nil {
		s.log.Error("record webhook attempt", "webhook", w.ID, "delivery", d.ID, "err", err)
		return
	}
	if aerr != nil {
		s.log.Info("webhook delivery attempt failed", "webhook", w.ID, "delivery", d.ID, "attempt", d.Attempts+1, "err", aerr)
	}
	if disabled {
		s.log.Warn("webhook disabled", "webhook", w.ID, "tenant", w.Tenant, "reason", reason)
		if err := s.audit.Append(audit.Record{Time: now, Tenant: w.Tenant, FrontEnd: "daemon", Action: "webhook.disable",
			Target: w.ID, Outcome: audit.Failure, Code: "failed_precondition"}); err != nil {
			s.log.Error("audit webhook disable", "webhook", w.ID, "err", err)
		}
	}
}

// post sends d to w once. It returns the HTTP status (0: no answer) and
// nil for a 2xx answer.
func (s *Service) post(ctx context.Context, w *store.Webhook, d store.WebhookDelivery) (int, error) {
	timeout := time.Duration(w.TimeoutMS) * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return 0, err
	}
	ts := s.now().Unix()
	sig, err := Sign(w.Secret, d.ID, ts, d.Payload)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "mcp-sandboxd-webhooks/"+version.Version)
	req.Header.Set("webhook-id", d.ID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	// A client per attempt: its dialer carries the hook's address policy,
	// and no connection is shared between tenants' hooks. No proxy: the
	// connection must go to the address the dialer checked.
	client := &http.Client{
		Transport: &http.Transport{
			Proxy: nil, DialContext: s.dialer(w.AllowPrivate), DisableKeepAlives: true,
			TLSHandshakeTimeout: timeout, ResponseHeaderTimeout: timeout, MaxResponseHeaderBytes: maxResponse,
		},
		// A redirect would send the payload where nobody checked: it is
		// a failure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, scrub(err, w.URL)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponse))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// scrub drops the URL from an error (the *url.Error prefix), which the
// delivery log already names by the webhook.
func scrub(err error, u string) error {
	msg := err.Error()
	if i := strings.Index(msg, u); i >= 0 {
		msg = strings.TrimPrefix(strings.TrimSpace(msg[i+len(u):]), "\": ")
		msg = strings.TrimPrefix(msg, ": ")
	}
	return errors.New(msg)
}

// Sign returns the webhook-signature header of a message as the Standard
// Webhooks specification defines it: "v1," and the base64 of the
// HMAC-SHA256, keyed with the secret's bytes (the base64 after whsec_), of
// "<msgID>.<timestamp>.<body>".
func Sign(secret, msgID string, ts int64, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.", msgID, ts)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}
