package network

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Network approvals while a call runs. A front end's call that runs in an
// allowlist sandbox watches it (Watch): it is told every name the DNS
// forwarder refuses the sandbox, and, if it can ask a human (an MCP
// client that declared elicitation), it is given a refused name while
// the sandbox's lookup of it is held: the forwarder does not answer
// until Approve decides, at most ApprovalHold. A yes changes the policy
// through the engine's SandboxNetwork (the one seam; audited there and
// by the caller), and the held lookup is then answered from upstream as
// for any allowed name, so the command that looked it up goes on.
//
// Bounds, each against a sandbox that looks up names to make its caller
// wait or to flood it: only valid host names are held; at most
// maxHeldNames names per sandbox are held at once (others are refused at
// once); the copies of one held lookup (the resolver's retries, A and
// AAAA) wait on one decision, and past maxHeldQueries copies more are
// dropped unanswered (the resolver's earlier copies get the answer); a
// hold ends at ApprovalHold, when the watching call ends, when the
// sandbox loses its address, and when the forwarder stops.

// DefaultApprovalHold is ApprovalHold when the configuration gives none.
const DefaultApprovalHold = 30 * time.Second

const (
	maxHeldNames   = 8
	maxHeldQueries = 32
)

// Watch is one call's view of its sandbox's DNS refusals.
type Watch struct {
	// Refused is told each name a lookup was finally refused (not
	// held, or held and not approved). It must not block.
	Refused func(name string)
	// Approve, if set, decides about a refused valid host name while
	// the lookup is held; it returns true once the sandbox's policy
	// allows name (changed through the engine's SandboxNetwork), false
	// to refuse. ctx ends with the hold. Nil: lookups are refused at
	// once, as without a watch.
	Approve func(ctx context.Context, sandboxID, name string) bool
}

type watchEntry struct {
	w   Watch
	ctx context.Context
}

// heldName is one refused name whose lookups wait for a decision.
type heldName struct {
	ctx     context.Context // the hold: ApprovalHold, the call, the sandbox
	cancel  context.CancelFunc
	done    chan struct{} // closed once allowed is set
	allowed bool
	queries int // lookups waiting (guarded by dnsMu)
}

// holdResult is what the forwarder does with a refused lookup.
type holdResult int

const (
	holdRefuse holdResult = iota // answer NXDOMAIN
	holdAllow                    // the policy changed: look again
	holdDrop                     // answer nothing (a copy too many)
)

// Watch makes w see sandbox id's refusals until ctx ends or stop is
// called; several calls may watch one sandbox (each is told every
// refusal; the oldest one with Approve decides).
func (m *Manager) Watch(ctx context.Context, id string, w Watch) (stop func(), err error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	sb := m.sandboxes[id]
	m.mu.Unlock()
	if sb == nil {
		return nil, errdefs.NotFoundf("sandbox_id: sandbox %s has no network", id)
	}
	// stop ends the watch's holds as well: they derive from its context.
	ctx, stop = context.WithCancel(ctx)
	e := &watchEntry{w: w, ctx: ctx}
	m.dnsMu.Lock()
	sb.watches = append(sb.watches, e)
	m.dnsMu.Unlock()
	context.AfterFunc(ctx, func() {
		m.dnsMu.Lock()
		sb.watches = slices.DeleteFunc(sb.watches, func(x *watchEntry) bool { return x == e })
		m.dnsMu.Unlock()
	})
	return stop, nil
}

func (m *Manager) approvalHold() time.Duration {
	if m.cfg.ApprovalHold > 0 {
		return m.cfg.ApprovalHold
	}
	return DefaultApprovalHold
}

// hold is the forwarder's question about a lookup of name refused to the
// sandbox at src: it returns at once without a watch that approves, and
// otherwise waits for the decision (started by the first copy).
func (m *Manager) hold(src netip.Addr, name string) holdResult {
	if !validHostname(name) {
		return holdRefuse
	}
	m.dnsMu.Lock()
	sb := m.byIP[src]
	if sb == nil {
		m.dnsMu.Unlock()
		return holdRefuse
	}
	h := sb.held[name]
	if h == nil {
		var approver *watchEntry
		for _, e := range sb.watches {
			if e.w.Approve != nil && e.ctx.Err() == nil {
				approver = e
				break
			}
		}
		if approver == nil || len(sb.held) >= maxHeldNames {
			m.dnsMu.Unlock()
			return holdRefuse
		}
		ctx, cancel := context.WithTimeout(approver.ctx, m.approvalHold())
		h = &heldName{ctx: ctx, cancel: cancel, done: make(chan struct{})}
		if sb.held == nil {
			sb.held = map[string]*heldName{}
		}
		sb.held[name] = h
		go m.decide(sb, name, h, approver.w.Approve)
	}
	if h.queries >= maxHeldQueries {
		m.dnsMu.Unlock()
		return holdDrop
	}
	h.queries++
	m.dnsMu.Unlock()

	allowed := false
	select {
	case <-h.done:
		allowed = h.allowed
	case <-h.ctx.Done():
		// Decided at the same moment, or not at all: an approver still
		// busy is ignored (its yes, if it comes, helps the next lookup).
		select {
		case <-h.done:
			allowed = h.allowed
		default:
		}
	}
	m.dnsMu.Lock()
	h.queries--
	m.dnsMu.Unlock()
	if allowed {
		return holdAllow
	}
	return holdRefuse
}

// decide runs approve for one held name and releases its lookups.
func (m *Manager) decide(sb *sandboxNet, name string, h *heldName, approve func(context.Context, string, string) bool) {
	ok := approve(h.ctx, sb.id, name)
	m.dnsMu.Lock()
	h.allowed = ok
	close(h.done)
	if sb.held[name] == h {
		delete(sb.held, name)
	}
	m.dnsMu.Unlock()
	h.cancel()
}

// releaseHeldLocked ends every hold of sb (it lost its address); dnsMu
// is held.
func releaseHeldLocked(sb *sandboxNet) {
	for name, h := range sb.held {
		h.cancel()
		delete(sb.held, name)
	}
}

// refusalWatchers are the Refused functions watching the sandbox at src.
func (m *Manager) refusalWatchers(sb *sandboxNet) []func(string) {
	var fns []func(string)
	for _, e := range sb.watches {
		if e.w.Refused != nil && e.ctx.Err() == nil {
			fns = append(fns, e.w.Refused)
		}
	}
	return fns
}
