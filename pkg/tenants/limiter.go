package tenants

import (
	"sync"
	"time"
)

// limiter is a token bucket of failed authentications per source address:
// each failure takes a token, tokens come back at rate per second up to
// burst. A source without tokens is refused before its key is hashed, so
// that a client trying keys in a loop costs the daemon a map read per try
// and learns nothing, while other sources are not affected.
type limiter struct {
	burst float64
	rate  float64
	now   func() time.Time

	mu      sync.Mutex
	sources map[string]*bucket
}

// bucket is a token bucket: tokens at time at.
type bucket struct {
	tokens float64
	at     time.Time
}

func newLimiter(burst int, rate float64, now func() time.Time) *limiter {
	return &limiter{burst: float64(burst), rate: rate, now: now, sources: map[string]*bucket{}}
}

// refill brings b to now; capacity and rate are per second.
func (b *bucket) refill(now time.Time, capacity, rate float64) {
	b.tokens = min(capacity, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
}

// allowed says whether source has a failure left to spend.
func (l *limiter) allowed(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.sources[source]
	if b == nil {
		return true
	}
	b.refill(l.now(), l.burst, l.rate)
	return b.tokens >= 1
}

// failed spends one of source's tokens.
func (l *limiter) failed(source string) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.sources[source]
	if b == nil {
		if len(l.sources) >= maxSources {
			l.prune(now)
		}
		if len(l.sources) >= maxSources {
			// Every tracked source is still failing: the table stays bounded
			// and this one goes untracked until some recover.
			return
		}
		b = &bucket{tokens: l.burst, at: now}
		l.sources[source] = b
	}
	b.refill(now, l.burst, l.rate)
	b.tokens = max(0, b.tokens-1)
}

// prune forgets sources whose bucket is full again.
func (l *limiter) prune(now time.Time) {
	for s, b := range l.sources {
		b.refill(now, l.burst, l.rate)
		if b.tokens >= l.burst {
			delete(l.sources, s)
		}
	}
}
