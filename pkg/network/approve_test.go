package network

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// lookup sends one query from inside the sandbox with a fixed id (a
// resolver's retry reuses it) and waits up to timeout; usable from any
// goroutine.
func lookup(a *Attachment, name string, qtype, id uint16, timeout time.Duration) (*dns.Msg, error) {
	ns, err := netns.GetFromPath(a.NetNSPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	var resp *dns.Msg
	err = InNetNS(ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		m.Id = id
		var err error
		resp, _, err = (&dns.Client{Timeout: timeout}).Exchange(m, net.JoinHostPort(a.Gateway.String(), "53"))
		return err
	})
	return resp, err
}

// TestApprovalHold: with a watch that approves, a refused lookup is held
// while the watch decides, once for all copies of it (the resolver's
// retries, A and AAAA); a yes that changes the policy answers them with
// the real address, a no with NXDOMAIN and the refusal recorded. A watch
// without Approve, an invalid name, a call that ends, the hold's bound,
// too many names and too many copies are not held (or no longer).
func TestApprovalHold(t *testing.T) {
	tp := newTopology(t)
	const hold = 2 * time.Second
	m := tp.manager(t, func(c *Config) { c.ApprovalHold = hold })
	const id = "sb-hold"
	a := attach(t, m, id, Request{Policy: Policy{Mode: ModeAllowlist, Allow: []string{"pkg.example.test"}}})

	// Hostile or unknown sandbox ids are refused, naming the field.
	for bad, code := range map[string]errdefs.Code{"../x": errdefs.InvalidArgument, "": errdefs.InvalidArgument, "sb-none": errdefs.NotFound} {
		if _, err := m.Watch(context.Background(), bad, Watch{}); errdefs.CodeOf(err) != code || !strings.Contains(err.Error(), "sandbox_id") {
			t.Errorf("Watch(%q) = %v, want %s naming sandbox_id", bad, err, code)
		}
	}

	type question struct {
		name   string
		answer chan bool
	}
	var asked atomic.Int32
	questions := make(chan question, 16)
	var refusedMu sync.Mutex
	var refused []string
	watch := func(ctx context.Context, approve bool) func() {
		w := Watch{Refused: func(name string) {
			refusedMu.Lock()
			refused = append(refused, name)
			refusedMu.Unlock()
		}}
		if approve {
			w.Approve = func(ctx context.Context, sandbox, name string) bool {
				asked.Add(1)
				if sandbox != id {
					t.Errorf("asked about sandbox %q, want %s", sandbox, id)
				}
				q := question{name, make(chan bool, 1)}
				questions <- q
				select {
				case yes := <-q.answer:
					if yes {
						// As the engine's SandboxNetwork would.
						st, err := m.Status(id)
						if err == nil {
							_, err = m.SetPolicy(context.Background(), id, Policy{Mode: ModeAllowlist, Allow: append(st.Allow, name)}, nil)
						}
						if err != nil {
							t.Errorf("set policy: %v", err)
							return false
						}
					}
					return yes
				case <-ctx.Done():
					return false
				}
			}
		}
		stop, err := m.Watch(ctx, id, w)
		must(t, err)
		return stop
	}
	next := func(t *testing.T) question {
		t.Helper()
		select {
		case q := <-questions:
			return q
		case <-time.After(5 * time.Second):
			t.Fatal("no question")
			return question{}
		}
	}
	type reply struct {
		msg *dns.Msg
		err error
		at  time.Duration
	}
	sendWithin := func(name string, qtype, qid uint16, timeout time.Duration) <-chan reply {
		ch := make(chan reply, 1)
		start := time.Now()
		go func() {
			msg, err := lookup(a, name, qtype, qid, timeout)
			ch <- reply{msg, err, time.Since(start)}
		}()
		return ch
	}
	send := func(name string, qtype, qid uint16) <-chan reply { return sendWithin(name, qtype, qid, 10*time.Second) }
	wantRcode := func(t *testing.T, what string, r reply, rcode int) {
		t.Helper()
		if r.err != nil || r.msg.Rcode != rcode {
			t.Fatalf("%s: %v %v, want rcode %d", what, r.msg, r.err, rcode)
		}
	}
	refusedNames := func() []string {
		refusedMu.Lock()
		defer refusedMu.Unlock()
		out := slices.Clone(refused)
		refused = nil
		return out
	}

	t.Run("yes", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		asked.Store(0)
		first := send("other.example.test", dns.TypeA, 101)
		q := next(t)
		// A retry of the same query and the AAAA lookup join the
		// question; nothing is answered before the decision.
		retry := send("other.example.test", dns.TypeA, 101)
		aaaa := send("other.example.test", dns.TypeAAAA, 102)
		select {
		case r := <-first:
			t.Fatalf("answered before the decision: %v %v", r.msg, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		if q.name != "other.example.test" {
			t.Fatalf("asked about %q", q.name)
		}
		q.answer <- true
		for _, ch := range []<-chan reply{first, retry} {
			r := <-ch
			wantRcode(t, "held A after yes", r, dns.RcodeSuccess)
			if len(r.msg.Answer) != 1 || r.msg.Answer[0].(*dns.A).A.String() != upstreamOther {
				t.Fatalf("held A after yes: %v", r.msg)
			}
		}
		wantRcode(t, "held AAAA after yes", <-aaaa, dns.RcodeSuccess)
		if n := asked.Load(); n != 1 {
			t.Errorf("asked %d times for one name, want 1", n)
		}
		// The address was admitted with the answer: the sandbox connects.
		if _, err := get(t, a, upstreamOther, "/", 3*time.Second); err != nil {
			t.Fatalf("GET after the yes: %v", err)
		}
		st, err := m.Status(id)
		must(t, err)
		if slices.Contains(st.Counters.DeniedDestinations, "other.example.test") || len(refusedNames()) != 0 {
			t.Errorf("an approved name was recorded as refused: %v", st.Counters.DeniedDestinations)
		}
	})

	t.Run("no", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		first := send("deny.example.test", dns.TypeA, 201)
		q := next(t)
		q.answer <- false
		wantRcode(t, "held lookup after no", <-first, dns.RcodeNameError)
		st, err := m.Status(id)
		must(t, err)
		if !slices.Contains(st.Counters.DeniedDestinations, "deny.example.test") || !slices.Equal(refusedNames(), []string{"deny.example.test"}) {
			t.Errorf("refusal after no not recorded: %v", st.Counters.DeniedDestinations)
		}
		if slices.Contains(st.Allow, "deny.example.test") {
			t.Errorf("allowlist changed after no: %v", st.Allow)
		}
	})

	t.Run("no approver", func(t *testing.T) {
		stop := watch(context.Background(), false)
		defer stop()
		r := <-send("nope.example.test", dns.TypeA, 301)
		wantRcode(t, "lookup without approver", r, dns.RcodeNameError)
		if r.at > time.Second {
			t.Errorf("refused after %v without an approver: held", r.at)
		}
		if got := refusedNames(); !slices.Equal(got, []string{"nope.example.test"}) {
			t.Errorf("refused seen by the watch: %q", got)
		}
	})

	t.Run("invalid name", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		asked.Store(0)
		for i, name := range []string{"bad!name.example.test", "-lead.example.test", "under_score-.example.test", "x\\.y.example.test"} {
			r := <-send(name, dns.TypeA, uint16(400+i))
			if r.err != nil || r.msg.Rcode != dns.RcodeNameError || r.at > time.Second {
				t.Errorf("%q: %v %v after %v, want NXDOMAIN at once", name, r.msg, r.err, r.at)
			}
		}
		if n := asked.Load(); n != 0 {
			t.Errorf("asked %d times about invalid names", n)
		}
		refusedNames()
	})

	t.Run("call ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		stop := watch(ctx, true)
		defer stop()
		first := send("gone.example.test", dns.TypeA, 501)
		next(t)
		start := time.Now()
		cancel() // the session went away mid-question
		wantRcode(t, "held lookup after the call ended", <-first, dns.RcodeNameError)
		if d := time.Since(start); d > time.Second {
			t.Errorf("released %v after the call ended", d)
		}
		// The ended call's watch asks no more.
		r := <-send("gone2.example.test", dns.TypeA, 502)
		if r.err != nil || r.msg.Rcode != dns.RcodeNameError || r.at > time.Second {
			t.Errorf("after the call: %v %v after %v", r.msg, r.err, r.at)
		}
		refusedNames()
	})

	t.Run("no answer", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		first := send("slow.example.test", dns.TypeA, 601)
		next(t) // never answered
		r := <-first
		wantRcode(t, "held lookup without an answer", r, dns.RcodeNameError)
		if r.at < hold-100*time.Millisecond || r.at > hold+time.Second {
			t.Errorf("answered after %v, want about the hold (%v)", r.at, hold)
		}
		refusedNames()
	})

	t.Run("bounds", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		var held []<-chan reply
		var qs []question
		for i := range maxHeldNames {
			held = append(held, send(fmt.Sprintf("n%d.example.test", i), dns.TypeA, uint16(700+i)))
			qs = append(qs, next(t))
		}
		// One name more is refused at once.
		r := <-send("extra.example.test", dns.TypeA, 799)
		if r.err != nil || r.msg.Rcode != dns.RcodeNameError || r.at > time.Second {
			t.Errorf("name beyond %d held: %v %v after %v", maxHeldNames, r.msg, r.err, r.at)
		}
		// Copies beyond maxHeldQueries of one held name get no answer
		// (each copy here has its own socket: the dropped ones time out).
		const extra = 5
		var copies []<-chan reply
		for i := range maxHeldQueries - 1 + extra {
			copies = append(copies, sendWithin("n0.example.test", dns.TypeA, uint16(800+i), 2*time.Second))
		}
		heldQueries := func() int {
			m.dnsMu.Lock()
			defer m.dnsMu.Unlock()
			for _, sb := range m.sandboxes {
				if h := sb.held["n0.example.test"]; h != nil {
					return h.queries
				}
			}
			return -1
		}
		for deadline := time.Now().Add(5 * time.Second); heldQueries() < maxHeldQueries; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d copies held, want %d", heldQueries(), maxHeldQueries)
			}
		}
		for _, q := range qs {
			q.answer <- false
		}
		for _, ch := range held {
			wantRcode(t, "held name after no", <-ch, dns.RcodeNameError)
		}
		answered, unanswered := 0, 0
		for _, ch := range copies {
			if r := <-ch; r.err == nil && r.msg.Rcode == dns.RcodeNameError {
				answered++
			} else {
				unanswered++
			}
		}
		// A dropped copy that reached the forwarder only after the
		// decision is answered: at most extra unanswered, and at least
		// every held one answered.
		if unanswered > extra || answered < maxHeldQueries-1 {
			t.Errorf("copies: %d answered, %d unanswered, want %d held ones answered and at most %d dropped", answered, unanswered, maxHeldQueries-1, extra)
		}
		refusedNames()
	})

	t.Run("sandbox gone", func(t *testing.T) {
		stop := watch(context.Background(), true)
		defer stop()
		first := send("late.example.test", dns.TypeA, 901)
		next(t)
		start := time.Now()
		m.mu.Lock()
		m.unmapLocked(id) // what disconnecting does first
		m.mu.Unlock()
		r := <-first
		if d := time.Since(start); d > time.Second {
			t.Errorf("held lookup released %v after the sandbox lost its address (%v %v)", d, r.msg, r.err)
		}
	})
}
