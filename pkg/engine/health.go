package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// Check is one readiness check (/readyz).
type Check = apitypes.Check

// Check statuses.
const (
	CheckOK       = apitypes.CheckOK
	CheckDegraded = apitypes.CheckDegraded
	CheckFailed   = apitypes.CheckFailed
)

func check(name string, required bool, err error) Check {
	if err != nil {
		return Check{Name: name, Status: CheckFailed, Reason: err.Error(), Required: required}
	}
	return Check{Name: name, Status: CheckOK, Required: required}
}

// Readiness runs every readiness check. The daemon is ready when every
// required check is ok.
func (e *Engine) Readiness(ctx context.Context) []Check {
	checks := []Check{
		check("store", true, errors.Join(e.store.Ping(ctx), e.store.CheckWritable(ctx))),
		check("cgroups", true, cgroups.CheckParent(e.cfg.Sandbox.CgroupParent)),
	}
	switch {
	case e.cfg.Sandbox.SeccompProfile == seccomp.Unconfined:
		checks = append(checks, Check{Name: "seccomp", Status: CheckDegraded, Reason: "turned off by sandbox.seccomp_profile: unconfined", Required: true})
	case !e.seccomp.OK():
		checks = append(checks, Check{Name: "seccomp", Status: CheckFailed, Reason: e.seccomp.Reason, Required: true})
	default:
		checks = append(checks, Check{Name: "seccomp", Status: CheckOK, Required: true})
	}
	checks = append(checks, e.landlockCheck())
	imgs, err := e.images.List()
	if err == nil && len(imgs) == 0 {
		err = fmt.Errorf("no image is built (sandboxctl images build shell)")
	}
	checks = append(checks, check("images", true, err))
	_, err = os.Stat(e.cfg.Paths.AgentPath)
	checks = append(checks, check("agent", true, err))
	if e.net == nil {
		checks = append(checks, Check{Name: "network", Status: CheckDegraded, Reason: fmt.Sprintf("only network mode none is available: %v", e.netErr), Required: false})
	} else {
		checks = append(checks, Check{Name: "network", Status: CheckOK, Required: false})
	}
	checks = append(checks, e.vmReadiness())
	return checks
}

// landlockCheck reports the Landlock layer: required only when
// sandbox.landlock is require (the daemon then did not start without it).
func (e *Engine) landlockCheck() Check {
	l := e.landlock
	c := Check{Name: "landlock", Required: l.Mode == landlock.ModeRequire}
	switch {
	case l.Enforce:
		c.Status = CheckOK
		c.Reason = fmt.Sprintf("ABI %d: files confined to the declared root and mounts; network not restricted (port-only rules, left to nftables)", l.ABI)
	case l.Mode == landlock.ModeRequire:
		c.Status, c.Reason = CheckFailed, l.Reason
	default:
		c.Status, c.Reason = CheckDegraded, l.Reason
	}
	return c
}

// Ready reports whether every required check passes.
func Ready(checks []Check) bool {
	for _, c := range checks {
		if c.Required && c.Status == CheckFailed {
			return false
		}
	}
	return true
}

// Healthy reports whether the engine can still do its work (the state store
// answers); the systemd watchdog is fed only while it does.
func (e *Engine) Healthy(ctx context.Context) error { return e.store.Ping(ctx) }

// Uptime is how long the engine has been running.
func (e *Engine) Uptime() time.Duration { return time.Since(e.started) }

// Status is the daemon's summary (sandboxctl status).
type Status = apitypes.Status

// Status summarises the daemon.
func (e *Engine) Status(ctx context.Context) (*Status, error) {
	checks := e.Readiness(ctx)
	st := &Status{
		Version: version.Version, Commit: version.Commit, UptimeS: e.Uptime().Seconds(),
		Cgroups: string(cgroups.HostMode()), Seccomp: e.seccomp.OK() && e.cfg.Sandbox.SeccompProfile != seccomp.Unconfined,
		Landlock: e.landlock.Enforce, LandlockABI: e.landlock.ABI,
		Ready: Ready(checks), Sandboxes: map[string]int{}, MaxSandboxes: e.cfg.Sandbox.MaxSandboxes, Checks: checks,
	}
	for _, s := range []sandbox.State{sandbox.StateCreating, sandbox.StateReady, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateTerminated, sandbox.StateFailed} {
		n, err := e.store.CountSandboxes(ctx, string(s))
		if err != nil {
			return nil, err
		}
		st.Sandboxes[string(s)] = n
	}
	return st, nil
}

// GC removes leftovers (containers, cgroups, mounts, directories) that belong
// to no live sandbox.
func (e *Engine) GC(ctx context.Context) (*sandbox.GCReport, error) {
	rep := e.sandboxes.GC(ctx)
	if e.net != nil {
		live := map[string]bool{}
		for _, id := range e.sandboxes.IDs() {
			live[id] = true
		}
		e.networkGC(ctx, rep, func(id string) bool { return live[id] })
	}
	return rep, nil
}

// SubscribeEvents streams state changes and output of sandbox id ("" for all)
// until ctx ends.
func (e *Engine) SubscribeEvents(ctx context.Context, id string) <-chan sandbox.Event {
	return e.sandboxes.Subscribe(ctx, id)
}
