// Package tenants holds the daemon's API keys and decides who a request is:
// one authenticator every front end (REST and MCP over HTTP, the E2B API,
// the web editor's logins, preview URLs) asks with the secret a client
// presented, which answers a principal.Principal or `unauthenticated`.
//
// Keys are stored only as SHA-256 hashes in a KeyStore — the daemon's
// SQLite store (table api_keys), or the fleet's PostgreSQL store that
// several gateways share, whose changes are watched — and held in memory by hash, so that authenticating is a
// hash and a map read, with no database access on the request path; the
// time a key was last used is written in batches (Options.TouchInterval),
// not per request. The keys of server.auth_token_file and e2b.api_key_file
// are admitted as admin keys of tenant "admin" (Source "file"): they keep
// working across the upgrade and change only by editing their files.
//
// The package also enforces each key's quota (Admit): live sandboxes,
// memory, CPUs and disk summed over the key's live sandboxes, and creates per
// minute as a token bucket.
package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// AdminTenant is the tenant of the keys read from files.
const AdminTenant = "admin"

// Defaults of Options.
const (
	DefaultTouchInterval = 10 * time.Second
	// DefaultFailureBurst failed authentications a source may make at once,
	// and DefaultFailureRate per second after that: a client that mistyped
	// its key is not locked out, one trying keys in a loop is.
	DefaultFailureBurst = 20
	DefaultFailureRate  = 2.0
	// maxSources bounds the failure table, so that failures from many
	// addresses cannot grow the daemon's memory.
	maxSources = 8192
)

// Options configure New.
type Options struct {
	// Store holds the keys (nil: only the keys of files); a KeyWatcher
	// is watched for other processes' changes.
	Store KeyStore
	// AdminToken is the content of server.auth_token_file ("" when the
	// daemon has no HTTP listener): the first admin key.
	AdminToken string
	// FileKeys are the keys of e2b.api_key_file: admin keys too, as they
	// opened every sandbox of the E2B API before tenants existed.
	FileKeys      []string
	TouchInterval time.Duration
	FailureBurst  int
	FailureRate   float64
	Log           *slog.Logger
	Now           func() time.Time
}

// Service is the key store, the authenticator and the quota keeper.
type Service struct {
	opt Options
	log *slog.Logger

	mu     sync.RWMutex
	byHash map[[32]byte]*entry
	byID   map[string]*entry
	gen    uint64 // changes of the maps by this service, under mu (Reload)

	usedMu sync.Mutex
	used   map[string]time.Time // key id → last use not yet written

	fail *limiter

	quotaMu  sync.Mutex
	reserved map[string]apitypes.KeyUse // key id → admitted creates still starting
	creates  map[string]*bucket         // key id → creates-per-minute bucket

	stop chan struct{}
	done chan struct{}
}

type entry struct {
	key  apitypes.Key
	hash [32]byte
}

// New loads the keys of the store and starts the writer of last-use times.
func New(ctx context.Context, opt Options) (*Service, error) {
	if opt.TouchInterval <= 0 {
		opt.TouchInterval = DefaultTouchInterval
	}
	if opt.FailureBurst <= 0 {
		opt.FailureBurst = DefaultFailureBurst
	}
	if opt.FailureRate <= 0 {
		opt.FailureRate = DefaultFailureRate
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		opt: opt, log: opt.Log,
		byHash: map[[32]byte]*entry{}, byID: map[string]*entry{}, used: map[string]time.Time{},
		fail:     newLimiter(opt.FailureBurst, opt.FailureRate, opt.Now),
		reserved: map[string]apitypes.KeyUse{}, creates: map[string]*bucket{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	s.SetFileKeys(opt.AdminToken, opt.FileKeys)
	if opt.Store != nil {
		recs, err := opt.Store.ListKeys(ctx)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if !r.RevokedAt.IsZero() {
				continue
			}
			e, err := entryOf(r)
			if err != nil {
				return nil, err
			}
			s.add(e)
		}
		if w, ok := opt.Store.(KeyWatcher); ok {
			s.watch(w)
		}
	}
	go s.touchLoop()
	return s, nil
}

// Close writes the pending last-use times and stops the writer.
func (s *Service) Close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	<-s.done
}

// SetFileKeys replaces the keys read from files: adminToken (the content
// of server.auth_token_file, "" for none) and the e2b.api_key_file keys,
// all admin keys of tenant AdminTenant.
func (s *Service) SetFileKeys(adminToken string, fileKeys []string) {
	s.mu.Lock()
	for h, e := range s.byHash {
		if e.key.Source == "file" {
			delete(s.byHash, h)
			delete(s.byID, e.key.ID)
		}
	}
	s.mu.Unlock()
	started := s.opt.Now().UTC()
	if adminToken != "" {
		s.add(&entry{hash: sha256.Sum256([]byte(adminToken)), key: apitypes.Key{
			ID: "key-token-file", Name: "auth-token-file", Tenant: AdminTenant, Scope: apitypes.ScopeAdmin, Source: "file", CreatedAt: started}})
	}
	for i, k := range fileKeys {
		s.add(&entry{hash: sha256.Sum256([]byte(k)), key: apitypes.Key{
			ID: fmt.Sprintf("key-e2b-file-%d", i+1), Name: fmt.Sprintf("e2b-api-key-file-%d", i+1), Tenant: AdminTenant,
			Scope: apitypes.ScopeAdmin, Source: "file", CreatedAt: started}})
	}
}

func (s *Service) add(e *entry) {
	s.mu.Lock()
	s.gen++
	s.byHash[e.hash] = e
	s.byID[e.key.ID] = e
	s.mu.Unlock()
}

func entryOf(r *store.KeyRecord) (*entry, error) {
	e := &entry{key: keyOf(r)}
	if len(r.Hash) != len(e.hash) {
		return nil, fmt.Errorf("api key %s: stored hash has %d bytes, want %d", r.ID, len(r.Hash), len(e.hash))
	}
	copy(e.hash[:], r.Hash)
	return e, nil
}

func keyOf(r *store.KeyRecord) apitypes.Key {
	k := apitypes.Key{ID: r.ID, Name: r.Name, Tenant: r.Tenant, Scope: apitypes.ScopeUser, Source: "store", CreatedAt: r.CreatedAt}
	if r.Admin {
		k.Scope = apitypes.ScopeAdmin
	}
	_ = json.Unmarshal(r.Quota, &k.Quota) // written by us from a Quota
	k.LastUsedAt, k.ExpiresAt, k.RevokedAt = timePtr(r.LastUsedAt), timePtr(r.ExpiresAt), timePtr(r.RevokedAt)
	return k
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// errBadKey is the one answer to a key that is malformed, unknown, revoked
// or expired: a client learns nothing about which.
func errBadKey() error {
	return errdefs.Unauthenticatedf("missing or invalid API key")
}

// Authenticate returns the principal of secret, presented from source (a
// host:port or host). A source whose failures exceed the rate limit is
// refused with `limit_exceeded` before its key is looked at.
func (s *Service) Authenticate(secret, source string) (principal.Principal, error) {
	host := sourceHost(source)
	if !s.fail.allowed(host) {
		return principal.Principal{}, errdefs.LimitExceededf("authentication: too many failed attempts from %s; retry later", host)
	}
	h := sha256.Sum256([]byte(secret))
	s.mu.RLock()
	e := s.byHash[h]
	s.mu.RUnlock()
	// The map is keyed by the hash, so its lookup time depends on the hash,
	// never on the secret; the comparison is constant-time all the same.
	if e == nil || subtle.ConstantTimeCompare(e.hash[:], h[:]) != 1 || s.expired(e) {
		s.fail.failed(host)
		return principal.Principal{}, errBadKey()
	}
	s.usedMu.Lock()
	s.used[e.key.ID] = s.opt.Now().UTC()
	s.usedMu.Unlock()
	return principal.Principal{KeyID: e.key.ID, KeyName: e.key.Name, Tenant: e.key.Tenant, Admin: e.key.Scope == apitypes.ScopeAdmin}, nil
}

// Valid says whether key id is still a key that authenticates (not
// revoked, not expired): the web editor's sessions and other long-lived
// admissions minted for a key ask this on every request.
func (s *Service) Valid(id string) bool {
	if id == "" {
		return true // the unix socket's principal
	}
	s.mu.RLock()
	e := s.byID[id]
	s.mu.RUnlock()
	return e != nil && !s.expired(e)
}

func (s *Service) expired(e *entry) bool {
	return e.key.ExpiresAt != nil && !s.opt.Now().Before(*e.key.ExpiresAt)
}

func sourceHost(source string) string {
	if h, _, err := net.SplitHostPort(source); err == nil {
		return h
	}
	return source
}

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// maxExpiry bounds expires_in_seconds (ten years).
const maxExpiry = 10 * 365 * 24 * 3600

// Create makes a key and returns it with its secret, which is not kept.
func (s *Service) Create(ctx context.Context, req apitypes.KeyCreateRequest) (*apitypes.KeySecret, error) {
	if !nameRe.MatchString(req.Name) {
		return nil, errdefs.Invalidf("name: want 1 to 63 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit), got %q", req.Name)
	}
	if req.Tenant == "" {
		req.Tenant = req.Name
	}
	if !nameRe.MatchString(req.Tenant) {
		return nil, errdefs.Invalidf("tenant: want 1 to 63 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit), got %q", req.Tenant)
	}
	if err := validQuota(req.Quota); err != nil {
		return nil, err
	}
	if req.ExpiresIn < 0 || req.ExpiresIn > maxExpiry {
		return nil, errdefs.Invalidf("expires_in_seconds: want 0 (never) to %d, got %d", maxExpiry, req.ExpiresIn)
	}
	secret := newSecret()
	now := s.opt.Now().UTC()
	quota, _ := json.Marshal(req.Quota)
	h := sha256.Sum256([]byte(secret))
	r := &store.KeyRecord{ID: newID(), Name: req.Name, Tenant: req.Tenant, Admin: req.Admin, Hash: h[:], Quota: quota, CreatedAt: now}
	if req.ExpiresIn > 0 {
		r.ExpiresAt = now.Add(time.Duration(req.ExpiresIn) * time.Second)
	}
	s.mu.RLock()
	for _, e := range s.byID {
		if e.key.Name == req.Name {
			s.mu.RUnlock()
			return nil, errdefs.Conflictf("name: a key named %q exists", req.Name)
		}
	}
	s.mu.RUnlock()
	if err := s.opt.Store.InsertKey(ctx, r); errors.Is(err, store.ErrExists) {
		return nil, errdefs.Conflictf("name: a key named %q exists (revoked keys keep their names)", req.Name)
	} else if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "record key %s", req.Name)
	}
	e, _ := entryOf(r)
	s.add(e)
	s.log.Info("api key created", "key", r.ID, "name", r.Name, "tenant", r.Tenant, "admin", r.Admin)
	return &apitypes.KeySecret{Key: e.key, Secret: secret}, nil
}

func validQuota(q apitypes.Quota) error {
	switch {
	case q.Sandboxes < 0:
		return errdefs.Invalidf("quota.sandboxes: must be 0 (no limit) or more, got %d", q.Sandboxes)
	case q.MemoryMB < 0:
		return errdefs.Invalidf("quota.memory_mb: must be 0 (no limit) or more, got %d", q.MemoryMB)
	case q.CPUs < 0 || q.CPUs != q.CPUs:
		return errdefs.Invalidf("quota.cpus: must be 0 (no limit) or more, got %v", q.CPUs)
	case q.DiskMB < 0:
		return errdefs.Invalidf("quota.disk_mb: must be 0 (no limit) or more, got %d", q.DiskMB)
	case q.CreatesPerMinute < 0 || q.CreatesPerMinute > 100000:
		return errdefs.Invalidf("quota.creates_per_minute: must be 0 (no limit) to 100000, got %d", q.CreatesPerMinute)
	}
	return nil
}

var idRe = regexp.MustCompile(`^key-[a-z0-9-]{1,40}$`)

func (s *Service) storedKey(id string) (*entry, error) {
	if !idRe.MatchString(id) {
		return nil, errdefs.Invalidf("key_id: want key- and lowercase letters, digits or '-', got %q", id)
	}
	s.mu.RLock()
	e := s.byID[id]
	s.mu.RUnlock()
	if e == nil {
		return nil, errdefs.NotFoundf("key_id: no key %q (or it is revoked)", id)
	}
	if e.key.Source == "file" {
		return nil, errdefs.Conflictf("key_id: key %s comes from a file (server.auth_token_file or e2b.api_key_file); change it by editing the file", id)
	}
	return e, nil
}

// Revoke ends key id: its next request is refused.
func (s *Service) Revoke(ctx context.Context, id string) (*apitypes.Key, error) {
	e, err := s.storedKey(id)
	if err != nil {
		return nil, err
	}
	now := s.opt.Now().UTC()
	if err := s.opt.Store.RevokeKey(ctx, id, now); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Wrap(errdefs.Internal, err, "revoke key %s", id)
	}
	s.mu.Lock()
	s.gen++
	delete(s.byHash, e.hash)
	delete(s.byID, id)
	s.mu.Unlock()
	k := e.key
	k.RevokedAt = &now
	s.log.Info("api key revoked", "key", id, "name", k.Name)
	return &k, nil
}

// Rotate gives key id a new secret; the old one stops working at once.
// The key keeps its id, name, tenant, quota and sandboxes.
func (s *Service) Rotate(ctx context.Context, id string) (*apitypes.KeySecret, error) {
	e, err := s.storedKey(id)
	if err != nil {
		return nil, err
	}
	secret := newSecret()
	h := sha256.Sum256([]byte(secret))
	if err := s.opt.Store.SetKeyHash(ctx, id, h[:]); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "rotate key %s", id)
	}
	s.mu.Lock()
	s.gen++
	delete(s.byHash, e.hash)
	ne := &entry{key: e.key, hash: h}
	s.byHash[h] = ne
	s.byID[id] = ne
	s.mu.Unlock()
	s.log.Info("api key rotated", "key", id, "name", e.key.Name)
	return &apitypes.KeySecret{Key: ne.key, Secret: secret}, nil
}

// List describes every key, the files' and the revoked ones included.
func (s *Service) List(ctx context.Context) ([]apitypes.Key, error) {
	recs, err := s.opt.Store.ListKeys(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list keys")
	}
	s.usedMu.Lock()
	pending := make(map[string]time.Time, len(s.used))
	for id, t := range s.used {
		pending[id] = t
	}
	s.usedMu.Unlock()
	var out []apitypes.Key
	s.mu.RLock()
	for _, e := range s.byID {
		if e.key.Source == "file" {
			k := e.key
			if t, ok := pending[k.ID]; ok {
				k.LastUsedAt = &t
			}
			out = append(out, k)
		}
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	for _, r := range recs {
		k := keyOf(r)
		if t, ok := pending[k.ID]; ok && (k.LastUsedAt == nil || t.After(*k.LastUsedAt)) {
			k.LastUsedAt = &t
		}
		out = append(out, k)
	}
	return out, nil
}

// Key returns the live key id (not revoked).
func (s *Service) Key(id string) (apitypes.Key, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.byID[id]
	if e == nil {
		return apitypes.Key{}, false
	}
	return e.key, true
}

// touchLoop writes last-use times every TouchInterval, and once more when
// the service closes.
func (s *Service) touchLoop() {
	defer close(s.done)
	t := time.NewTicker(s.opt.TouchInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.Flush(context.Background())
		case <-s.stop:
			s.Flush(context.Background())
			return
		}
	}
}

// Flush writes the pending last-use times now.
func (s *Service) Flush(ctx context.Context) {
	s.usedMu.Lock()
	used := s.used
	s.used = map[string]time.Time{}
	s.usedMu.Unlock()
	if s.opt.Store == nil {
		return
	}
	for id := range used {
		if e, ok := s.Key(id); ok && e.Source == "file" {
			delete(used, id) // not a row of the store
		}
	}
	if err := s.opt.Store.TouchKeys(ctx, used); err != nil {
		s.log.Warn("record api key use", "err", err)
	}
}

func newSecret() string {
	b := make([]byte, 20) // e2b_ and 40 hex digits: the form E2B's SDKs accept
	_, _ = rand.Read(b)   // crypto/rand.Read never fails (Go 1.24+)
	return "e2b_" + hex.EncodeToString(b)
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "key-" + hex.EncodeToString(b)
}
