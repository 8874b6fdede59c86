package mcpserver

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Network approvals through elicitation (docs/mcp.md). A call that runs
// in an allowlist sandbox (exec_command, run_task, packages_install,
// run_code with sandbox_id, and run_code's fresh sandbox) watches it
// through the engine (WatchNetwork, WithNetworkWatch: pkg/network's
// Watch) while it runs. When the calling client declared elicitation,
// the DNS forwarder holds a lookup it refuses (a valid host name; at
// most network.approval_hold) and the client is asked at once, in form
// mode, whether to allow the host; a yes adds it to the sandbox's
// allowlist through the engine's SandboxNetwork (the seam every front end
// changes a policy through), is audit-logged as that principal's policy
// change, and the held lookup is then answered: the same call goes on.
// Without elicitation nothing is held. Either way the names refused
// during the call are reported in its result (network_refusals, with the
// allowlist that would have let the call through). Only the session
// running the call is asked, so a tenant's sandbox asks only its own
// tenant's sessions. mcp-go v1.2.1 carries RequestElicitation (form
// mode) but nothing that watches a sandbox: that is this file.

const (
	// approvalTimeout bounds how long a question waits for the answer
	// besides the hold (network.approval_hold, shorter by default): no
	// answer leaves the host refused.
	approvalTimeout = 2 * time.Minute
	// approvalWindow is how long a host, once asked about in a sandbox, is
	// not asked about again there (whatever the answer).
	approvalWindow = 10 * time.Minute
	// maxApprovalsPerCall bounds the questions one call asks; names
	// beyond are refused at once.
	maxApprovalsPerCall = 4
)

// approvals remembers which hosts were asked about, per sandbox.
type approvals struct {
	mu    sync.Mutex
	asked map[string]time.Time // sandbox id + "\x00" + host
	// change serialises the read-modify-write of an allowlist by
	// concurrent approvals.
	change sync.Mutex
}

// first reports whether host in sandbox id was not asked about within the
// window, and records it as asked now.
func (a *approvals) first(id, host string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.asked == nil {
		a.asked = map[string]time.Time{}
	}
	for k, t := range a.asked {
		if now.Sub(t) > approvalWindow {
			delete(a.asked, k)
		}
	}
	k := id + "\x00" + host
	if _, ok := a.asked[k]; ok {
		return false
	}
	a.asked[k] = now
	return true
}

// canElicit reports whether the calling client declared elicitation.
func canElicit(ctx context.Context) bool {
	sess, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo)
	return ok && sess.GetClientCapabilities().Elicitation != nil
}

// callWatch is one call's record of its sandbox's refusals and approvals.
type callWatch struct {
	s   *srv
	ctx context.Context // the call's

	mu       sync.Mutex
	refused  []string // finally refused, in order, once each
	approved []string
	allow    []string // the allowlist after the last approval
	asked    int
}

func (w *callWatch) watch(elicit bool) engine.NetworkWatch {
	nw := engine.NetworkWatch{Refused: w.refusedName}
	if elicit {
		nw.Approve = w.approve
	}
	return nw
}

func (w *callWatch) refusedName(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Contains(w.refused, name) {
		w.refused = append(w.refused, name)
	}
}

// approve asks the calling client about host while the sandbox's lookup
// is held (ctx ends with the hold), and on a yes adds host to the
// sandbox's allowlist.
func (w *callWatch) approve(ctx context.Context, id, host string) bool {
	if !validHost(host) {
		return false // pkg/network holds only valid names; twice is cheap
	}
	w.mu.Lock()
	if w.asked >= maxApprovalsPerCall {
		w.mu.Unlock()
		return false
	}
	if !w.s.approvals.first(id, host, time.Now()) {
		w.mu.Unlock()
		return false
	}
	w.asked++
	w.mu.Unlock()
	if !w.s.askApproval(ctx, id, host) {
		return false
	}
	// The change outlives the hold: a yes that came is honoured.
	cctx := context.WithoutCancel(w.ctx)
	w.s.approvals.change.Lock()
	st, err := w.s.e.SandboxNetwork(cctx, apitypes.SandboxNetworkRequest{SandboxID: id})
	if err == nil {
		st, err = w.s.e.SandboxNetwork(cctx, apitypes.SandboxNetworkRequest{SandboxID: id, Mode: engine.NetworkAllowlist,
			Allow: append(slices.Clone(st.Allow), host)})
	}
	w.s.approvals.change.Unlock()
	w.s.auditApproval(w.ctx, id, host, err)
	if err != nil {
		w.s.log.Warn("mcp: approved host not allowed", "sandbox", id, "host", host, "err", err)
		return false
	}
	w.mu.Lock()
	w.approved = append(w.approved, host)
	w.allow = st.Allow
	w.mu.Unlock()
	return true
}

// validHost is a DNS host name: letters, digits, hyphens and underscores
// in dot-separated labels of 1 to 63, at most 253 in all.
func validHost(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range []byte(l) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// watchRefusals runs fn, a call in sandbox id (empty: in a sandbox the
// call makes itself, run_code's fresh one), watching the sandbox's DNS
// refusals when it is in allowlist mode, and reports them in the result.
// Any other sandbox (no network, egress, a VM) runs fn alone.
func (s *srv) watchRefusals(ctx context.Context, id string, fn func(context.Context) (*result, error)) (*result, error) {
	w := &callWatch{s: s, ctx: ctx}
	elicit := canElicit(ctx)
	var before *apitypes.NetworkStatus
	if id == "" {
		ctx = engine.WithNetworkWatch(ctx, w.watch(elicit))
	} else {
		var err error
		before, err = s.e.SandboxNetwork(ctx, apitypes.SandboxNetworkRequest{SandboxID: id})
		if err != nil || before.Mode != engine.NetworkAllowlist {
			// No network (conflict), no network subsystem, not a sandbox:
			// the call itself says what is wrong, if anything.
			return fn(ctx)
		}
		stop, err := s.e.WatchNetwork(ctx, id, w.watch(elicit))
		if err != nil {
			s.log.Warn("mcp: sandbox refusals not watched", "sandbox", id, "err", err)
		} else {
			defer stop()
		}
	}
	r, err := fn(ctx)
	if err != nil || r == nil {
		return r, err
	}
	w.mu.Lock()
	refused, approved, allow := slices.Clone(w.refused), slices.Clone(w.approved), slices.Clone(w.allow)
	w.mu.Unlock()
	if before != nil {
		after, err := s.e.SandboxNetwork(context.WithoutCancel(ctx), apitypes.SandboxNetworkRequest{SandboxID: id})
		if err != nil {
			return r, nil // e.g. the command removed its own sandbox
		}
		// The forwarder's record (refusals the watch missed, e.g. when
		// WatchNetwork failed) with the watch's.
		for _, h := range newRefusals(before.Counters.DeniedDestinations, after.Counters.DeniedDestinations) {
			if !slices.Contains(refused, h) {
				refused = append(refused, h)
			}
		}
		allow = after.Allow
	}
	// An approved host refused again (a lookup before the yes, say) is
	// allowed now: not refused.
	refused = slices.DeleteFunc(refused, func(h string) bool { return slices.Contains(approved, h) })
	if len(refused) == 0 && len(approved) == 0 {
		return r, nil
	}
	rep := &apitypes.NetworkRefusals{Refused: refused, Approved: approved, ProposedAllow: slices.Clone(allow)}
	if rep.Refused == nil {
		rep.Refused = []string{}
	}
	if rep.ProposedAllow == nil {
		rep.ProposedAllow = []string{}
	}
	for _, h := range append(slices.Clone(approved), refused...) {
		if !slices.Contains(rep.ProposedAllow, h) {
			rep.ProposedAllow = append(rep.ProposedAllow, h)
		}
	}
	attachRefusals(r, rep)
	return r, nil
}

// newRefusals are the host names in after (the sandbox's recent refused
// destinations) that were not in before. Addresses are left out: they
// are dropped connections, which the DNS forwarder did not refuse by
// name, and an allowlist of addresses is rarely what a client means.
func newRefusals(before, after []string) []string {
	var out []string
	for _, d := range after {
		if slices.Contains(before, d) || slices.Contains(out, d) {
			continue
		}
		if _, err := netip.ParseAddr(d); err == nil {
			continue
		}
		out = append(out, d)
	}
	return out
}

// askApproval asks the calling client whether to allow host for sandbox
// id: true only for an accept whose form says allow: true.
func (s *srv) askApproval(ctx context.Context, id, host string) bool {
	ctx, cancel := context.WithTimeout(ctx, s.approvalTimeout())
	defer cancel()
	res, err := s.mcp.RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{
		Mode: "form",
		Message: fmt.Sprintf("Sandbox %s (network allowlist) is refused %s; its lookup waits for your answer. Allow %s for sandbox %s?",
			id, host, host, id),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"allow": map[string]any{"type": "boolean", "title": "Allow " + host,
					"description": fmt.Sprintf("Add %s to the allowlist of sandbox %s", host, id)},
			},
			"required": []string{"allow"},
		},
	}})
	if err != nil {
		s.log.Info("mcp: network approval not answered", "sandbox", id, "host", host, "err", err)
		return false
	}
	return approved(res)
}

// approved reads an answer: only accept with allow exactly true is a yes
// (a string "true", a missing field or any other action is a no).
func approved(res *mcp.ElicitationResult) bool {
	if res == nil || res.Action != mcp.ElicitationResponseActionAccept {
		return false
	}
	// Transports hand the content over decoded from JSON.
	content, _ := res.Content.(map[string]any)
	allow, _ := content["allow"].(bool)
	return allow
}

func (s *srv) approvalTimeout() time.Duration {
	if s.opt.ApprovalTimeout > 0 {
		return s.opt.ApprovalTimeout
	}
	return approvalTimeout
}

// auditApproval records an approved host as the calling principal's
// change of the sandbox's network policy.
func (s *srv) auditApproval(ctx context.Context, id, host string, err error) {
	if s.opt.Audit == nil {
		return
	}
	p, ok := principal.From(ctx)
	o := principal.OriginFrom(ctx)
	frontEnd := "mcp"
	if !ok {
		p = principal.Principal{KeyName: "stdio", Admin: true}
		o = principal.Origin{FrontEnd: "stdio", Source: "stdio"}
		frontEnd = "stdio"
	}
	rec := audit.Record{KeyID: p.KeyID, KeyName: p.KeyName, Tenant: p.Tenant, Admin: p.Admin, FrontEnd: frontEnd, Source: o.Source,
		Action: "mcp:network_approval", Target: id + " allow " + host, Outcome: audit.Success}
	if err != nil {
		rec.Outcome = audit.Failure
	}
	_ = s.opt.Audit.Append(rec)
}

// attachRefusals puts rep into a command's or run's result and its text.
func attachRefusals(r *result, rep *apitypes.NetworkRefusals) {
	switch v := r.structured.(type) {
	case apitypes.CommandResult:
		v.NetworkRefusals = rep
		r.structured = v
	case apitypes.RunResult:
		v.NetworkRefusals = rep
		r.structured = v
	}
	var parts []string
	if len(rep.Refused) > 0 {
		parts = append(parts, "refused "+strings.Join(rep.Refused, ", "))
	}
	if len(rep.Approved) > 0 {
		parts = append(parts, "allowed during this call after your approval: "+strings.Join(rep.Approved, ", "))
	}
	parts = append(parts, "an allowlist that lets this through: "+strings.Join(rep.ProposedAllow, ", "))
	r.text += "\nnetwork: " + strings.Join(parts, "; ")
}
