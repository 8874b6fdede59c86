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
// in an allowlist sandbox (exec_command, run_code with sandbox_id,
// run_task, packages_install) compares the sandbox's refused names
// (pkg/network's DNS forwarder records them) before and after: the new
// ones are reported in the result (network_refusals, with the allowlist
// that would have let the call through), and when the calling client
// declared elicitation it is asked, in form mode, whether to allow each
// host; a yes adds it to the sandbox's allowlist through the engine's
// SandboxNetwork (the seam every front end changes a policy through) and
// is audit-logged as that principal's policy change. Only the session
// running the call is asked, so a tenant's sandbox asks only its own
// tenant's sessions. mcp-go v1.2.1 carries RequestElicitation (form
// mode) but nothing that watches a sandbox: that is this file.

const (
	// approvalTimeout bounds how long a call waits for the answer: no
	// answer leaves the host refused.
	approvalTimeout = 2 * time.Minute
	// approvalWindow is how long a host, once asked about in a sandbox, is
	// not asked about again there (whatever the answer).
	approvalWindow = 10 * time.Minute
	// maxApprovalsPerCall bounds the questions one call asks.
	maxApprovalsPerCall = 4
)

// approvals remembers which hosts were asked about, per sandbox.
type approvals struct {
	mu    sync.Mutex
	asked map[string]time.Time // sandbox id + "\x00" + host
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

// watchRefusals runs fn, a call in sandbox id, and reports the hosts the
// sandbox was refused meanwhile when it is in allowlist mode, asking an
// eliciting client to allow them. Any other sandbox (no network, egress,
// a VM, none given) runs fn alone.
func (s *srv) watchRefusals(ctx context.Context, id string, fn func() (*result, error)) (*result, error) {
	if id == "" {
		return fn()
	}
	before, err := s.e.SandboxNetwork(ctx, apitypes.SandboxNetworkRequest{SandboxID: id})
	if err != nil || before.Mode != engine.NetworkAllowlist {
		// No network (conflict), no network subsystem, not a sandbox:
		// the call itself says what is wrong, if anything.
		return fn()
	}
	r, err := fn()
	if err != nil || r == nil {
		return r, err
	}
	after, err := s.e.SandboxNetwork(context.WithoutCancel(ctx), apitypes.SandboxNetworkRequest{SandboxID: id})
	if err != nil {
		return r, nil // e.g. the command removed its own sandbox
	}
	refused := newRefusals(before.Counters.DeniedDestinations, after.Counters.DeniedDestinations)
	if len(refused) == 0 {
		return r, nil
	}
	rep := &apitypes.NetworkRefusals{Refused: refused}
	allow := slices.Clone(after.Allow)
	if canElicit(ctx) {
		for i, host := range refused {
			if i == maxApprovalsPerCall {
				break
			}
			if !s.approvals.first(id, host, time.Now()) || !s.askApproval(ctx, id, host) {
				continue
			}
			next := append(slices.Clone(allow), host)
			st, err := s.e.SandboxNetwork(context.WithoutCancel(ctx), apitypes.SandboxNetworkRequest{SandboxID: id, Mode: engine.NetworkAllowlist, Allow: next})
			s.auditApproval(ctx, id, host, err)
			if err != nil {
				s.log.Warn("mcp: approved host not allowed", "sandbox", id, "host", host, "err", err)
				continue
			}
			allow = st.Allow
			rep.Approved = append(rep.Approved, host)
		}
	}
	rep.ProposedAllow = allow
	for _, h := range refused {
		if !slices.Contains(allow, h) {
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
		Mode:    "form",
		Message: fmt.Sprintf("Sandbox %s (network allowlist) was refused %s. Allow %s for sandbox %s?", id, host, host, id),
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
	line := "network: refused " + strings.Join(rep.Refused, ", ")
	if len(rep.Approved) > 0 {
		line += "; allowed now after your approval: " + strings.Join(rep.Approved, ", ") + " (run again)"
	}
	line += "; an allowlist that lets this through: " + strings.Join(rep.ProposedAllow, ", ")
	r.text += "\n" + line
}
