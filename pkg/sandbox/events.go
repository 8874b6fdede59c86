package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Event is a state change or a piece of command output, as published to
// subscribers (REST /v1/events).
type Event = apitypes.Event

// subscriberBuffer is how many events a subscriber may lag behind before it
// starts losing them; a slow reader must never slow sandboxes down.
const subscriberBuffer = 256

type subscriber struct {
	ch        chan Event
	sandboxID string // "" for all
	// tenant, when own is set, is the only tenant whose events the
	// subscriber sees (a non-admin caller).
	tenant  string
	own     bool
	dropped int
}

// bus fans events out to subscribers without ever blocking the publisher.
type bus struct {
	mu   sync.Mutex
	seq  int64
	subs map[*subscriber]struct{}
}

func (b *bus) active() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs) > 0
}

func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	ev.Seq, ev.Time = b.seq, time.Now().UTC()
	for s := range b.subs {
		if (s.sandboxID != "" && s.sandboxID != ev.SandboxID) || (s.own && s.tenant != ev.Tenant) {
			continue
		}
		if s.dropped > 0 {
			select {
			case s.ch <- Event{Seq: ev.Seq, Time: ev.Time, Type: "dropped", Dropped: s.dropped}:
				s.dropped = 0
			default:
				s.dropped++
				continue
			}
		}
		select {
		case s.ch <- ev:
		default:
			s.dropped++
		}
	}
}

// subscribe returns a channel of events about sandboxID ("" for all) that is
// closed when ctx ends.
func (b *bus) subscribe(ctx context.Context, sandboxID string) <-chan Event {
	s := &subscriber{ch: make(chan Event, subscriberBuffer), sandboxID: sandboxID}
	if p, ok := principal.From(ctx); ok && !p.Admin {
		s.tenant, s.own = p.Tenant, true
	}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = map[*subscriber]struct{}{}
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	go func() {
		<-ctx.Done()
		b.mu.Lock()
		delete(b.subs, s)
		close(s.ch)
		b.mu.Unlock()
	}()
	return s.ch
}

// Subscribe streams state changes and command output of sandbox id ("" for
// every sandbox) until ctx ends. A subscriber that falls behind loses events
// and is told how many with a "dropped" event.
func (m *Manager) Subscribe(ctx context.Context, id string) <-chan Event {
	return m.events.subscribe(ctx, id)
}
