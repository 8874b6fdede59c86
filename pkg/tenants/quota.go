package tenants

import (
	"context"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Holdings is what a key's live sandboxes hold (the sandbox service
// counts them: a sandbox that ends frees its share at once).
type Holdings func(keyID string) apitypes.KeyUse

// Admit checks a create of a sandbox of limits want against the quota of
// the key ctx's principal authenticated with, counting what the key's
// live sandboxes hold and the creates admitted and still starting. It
// returns release, which the caller calls once the create has ended (the
// sandbox then counts among the live ones, or never will). A call without
// a key (the unix socket, the engine's own work) is always admitted.
func (s *Service) Admit(ctx context.Context, want apitypes.Limits, held Holdings) (release func(), err error) {
	p, ok := principal.From(ctx)
	if !ok || p.KeyID == "" {
		return func() {}, nil
	}
	k, ok := s.Key(p.KeyID)
	if !ok && principal.OriginFrom(ctx).FrontEnd == "gateway" {
		// A fleet key a gateway authenticated, which this node's own
		// store does not hold: its quota is counted where the fleet's
		// keys are (the store the gateways and nodes share), not here.
		return func() {}, nil
	}
	if !ok {
		// Revoked between authentication and now: the request ends here.
		return nil, errBadKey()
	}
	q := k.Quota
	add := apitypes.KeyUse{Sandboxes: 1, MemoryMB: mib(want.MemoryBytes), CPUs: want.CPUs, DiskMB: mib(want.DiskBytes)}

	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	use := held(p.KeyID)
	r := s.reserved[p.KeyID]
	use.Sandboxes += r.Sandboxes
	use.MemoryMB += r.MemoryMB
	use.CPUs += r.CPUs
	use.DiskMB += r.DiskMB
	switch {
	case q.Sandboxes > 0 && use.Sandboxes+add.Sandboxes > q.Sandboxes:
		return nil, errdefs.LimitExceededf("quota sandboxes: key %s may hold %d live sandboxes and holds %d", k.Name, q.Sandboxes, use.Sandboxes)
	case q.MemoryMB > 0 && use.MemoryMB+add.MemoryMB > q.MemoryMB:
		return nil, errdefs.LimitExceededf("quota memory_mb: key %s may hold %d MiB and holds %d MiB; this sandbox asks %d MiB", k.Name, q.MemoryMB, use.MemoryMB, add.MemoryMB)
	case q.CPUs > 0 && use.CPUs+add.CPUs > q.CPUs+1e-9:
		return nil, errdefs.LimitExceededf("quota cpus: key %s may hold %g CPUs and holds %g; this sandbox asks %g", k.Name, q.CPUs, use.CPUs, add.CPUs)
	case q.DiskMB > 0 && use.DiskMB+add.DiskMB > q.DiskMB:
		return nil, errdefs.LimitExceededf("quota disk_mb: key %s may hold %d MiB of disk and holds %d MiB; this sandbox asks %d MiB", k.Name, q.DiskMB, use.DiskMB, add.DiskMB)
	}
	if q.CreatesPerMinute > 0 {
		b := s.createBucket(p.KeyID, q.CreatesPerMinute)
		if b.tokens < 1 {
			return nil, errdefs.LimitExceededf("quota creates_per_minute: key %s may create %d sandboxes a minute and created %d in the last minute; retry later",
				k.Name, q.CreatesPerMinute, q.CreatesPerMinute-int(b.tokens))
		}
		b.tokens--
	}
	r.Sandboxes += add.Sandboxes
	r.MemoryMB += add.MemoryMB
	r.CPUs += add.CPUs
	r.DiskMB += add.DiskMB
	s.reserved[p.KeyID] = r
	var once bool
	return func() {
		s.quotaMu.Lock()
		defer s.quotaMu.Unlock()
		if once {
			return
		}
		once = true
		r := s.reserved[p.KeyID]
		r.Sandboxes -= add.Sandboxes
		r.MemoryMB -= add.MemoryMB
		r.CPUs -= add.CPUs
		r.DiskMB -= add.DiskMB
		if r.Sandboxes <= 0 {
			delete(s.reserved, p.KeyID)
		} else {
			s.reserved[p.KeyID] = r
		}
	}, nil
}

// createBucket returns key id's creates bucket refilled to now; quotaMu
// is held. The bucket holds a minute's worth of creates and refills at
// perMinute/60 a second.
func (s *Service) createBucket(id string, perMinute int) *bucket {
	now := s.opt.Now()
	b := s.creates[id]
	if b == nil {
		b = &bucket{tokens: float64(perMinute), at: now}
		s.creates[id] = b
	}
	b.refill(now, float64(perMinute), float64(perMinute)/float64(time.Minute/time.Second))
	return b
}

// Usage is key id's quota and use.
func (s *Service) Usage(id string, held Holdings) (*apitypes.KeyUsage, error) {
	k, ok := s.Key(id)
	if !ok {
		return nil, errdefs.NotFoundf("key_id: no key %q (or it is revoked)", id)
	}
	u := &apitypes.KeyUsage{KeyID: k.ID, Name: k.Name, Tenant: k.Tenant, Quota: k.Quota, Use: held(id)}
	if k.Quota.CreatesPerMinute > 0 {
		s.quotaMu.Lock()
		b := s.createBucket(id, k.Quota.CreatesPerMinute)
		u.Use.CreatesLastMinute = k.Quota.CreatesPerMinute - int(b.tokens)
		s.quotaMu.Unlock()
	}
	return u, nil
}

func mib(b int64) int64 { return (b + 1<<20 - 1) >> 20 }
