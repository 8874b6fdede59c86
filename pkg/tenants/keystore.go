package tenants

import (
	"context"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// KeyStore is what the service needs of a store: the api_keys rows. The
// daemon's SQLite store (*store.Store) is one; the fleet's PostgreSQL
// store (pkg/store/pgstore) the other, shared by every gateway. The
// secret's hash is compared here, in constant time, never in a query.
type KeyStore interface {
	InsertKey(ctx context.Context, r *store.KeyRecord) error
	ListKeys(ctx context.Context) ([]*store.KeyRecord, error)
	RevokeKey(ctx context.Context, id string, at time.Time) error
	SetKeyHash(ctx context.Context, id string, hash []byte) error
	// TouchKeys is called once per Options.TouchInterval with the batch
	// of last-use times, never per request.
	TouchKeys(ctx context.Context, used map[string]time.Time) error
}

// KeyWatcher is a KeyStore other processes change too (the fleet's): it
// calls changed after each change committed by anyone, until ctx ends,
// and the service then reloads its keys, so that a key created, rotated
// or revoked through one gateway authenticates, or stops, on every other
// at once rather than at its restart.
type KeyWatcher interface {
	WatchKeys(ctx context.Context, changed func()) error
}

// watch reloads the keys whenever w says they changed, until Close.
func (s *Service) watch(w KeyWatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.stop
		cancel()
	}()
	go func() {
		_ = w.WatchKeys(ctx, func() {
			if err := s.Reload(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("reload api keys", "err", err)
			}
		})
	}()
}

// Reload replaces the store's keys held in memory by the store's live
// keys (revoked and rotated ones drop out, new ones come in); the keys of
// files stay as they are.
func (s *Service) Reload(ctx context.Context) error {
	recs, err := s.opt.Store.ListKeys(ctx)
	if err != nil {
		return err
	}
	live := make([]*entry, 0, len(recs))
	for _, r := range recs {
		if !r.RevokedAt.IsZero() {
			continue
		}
		e, err := entryOf(r)
		if err != nil {
			return err
		}
		live = append(live, e)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, e := range s.byHash {
		if e.key.Source != "file" {
			delete(s.byHash, h)
			delete(s.byID, e.key.ID)
		}
	}
	for _, e := range live {
		s.byHash[e.hash] = e
		s.byID[e.key.ID] = e
	}
	return nil
}
