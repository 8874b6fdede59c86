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
// files stay as they are. A listing that this service's own Create,
// Rotate or Revoke overtook is taken again: applied, it could bring back
// a key just revoked here.
func (s *Service) Reload(ctx context.Context) error {
	for try := 0; ; try++ {
		s.mu.RLock()
		gen := s.gen
		s.mu.RUnlock()
		live, err := s.liveKeys(ctx)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if s.gen != gen && try < 10 {
			s.mu.Unlock()
			continue
		}
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
		s.mu.Unlock()
		return nil
	}
}

func (s *Service) liveKeys(ctx context.Context) ([]*entry, error) {
	recs, err := s.opt.Store.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	live := make([]*entry, 0, len(recs))
	for _, r := range recs {
		if !r.RevokedAt.IsZero() {
			continue
		}
		e, err := entryOf(r)
		if err != nil {
			return nil, err
		}
		live = append(live, e)
	}
	return live, nil
}
