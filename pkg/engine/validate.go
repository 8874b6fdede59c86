package engine

import (
	"math"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The validators every entry point shares, so that one kind of input is
// checked one way whichever tool, endpoint or command carries it. Each error
// names the request field it is about.

// Network modes of a sandbox.
const (
	NetworkNone      = "none"
	NetworkEgress    = "egress"
	NetworkAllowlist = "allowlist"
)

// duration turns a request's seconds into a duration (apitypes.Seconds:
// services outside the engine validate seconds the same way).
func duration(field string, secs float64, max time.Duration) (time.Duration, error) {
	return apitypes.Seconds(field, secs, max)
}

// wholeSeconds is duration for integer fields (ttl_seconds).
func wholeSeconds(field string, secs int64, max time.Duration) (time.Duration, error) {
	if secs <= 0 {
		return 0, errdefs.Invalidf("%s: must be positive, got %d", field, secs)
	}
	return duration(field, float64(secs), max)
}

// megabytes turns a request's MiB count into bytes within [min, max] bytes
// (max 0: no maximum), refusing values whose byte count would overflow.
func megabytes(field string, mb, min, max int64) (int64, error) {
	if mb > math.MaxInt64/mib || mb < math.MinInt64/mib {
		return 0, errdefs.Invalidf("%s: %d MiB is out of range", field, mb)
	}
	if err := checkRange(field, mb*mib, min, max, mib); err != nil {
		return 0, err
	}
	return mb * mib, nil
}

func checkRange(field string, v, min, max, unit int64) error {
	if v < min {
		return errdefs.Invalidf("%s: must be at least %d, got %d", field, min/unit, v/unit)
	}
	if max > 0 && v > max {
		return errdefs.Invalidf("%s: %d exceeds the maximum %d", field, v/unit, max/unit)
	}
	return nil
}

// networkMode resolves a request's network mode: empty means the
// configured default. Only "none" exists until the network subsystem does;
// the other modes are refused as unavailable rather than silently dropped.
func (e *Engine) networkMode(field, mode string) (string, error) {
	if mode == "" {
		mode = e.cfg.Network.DefaultMode
	}
	switch mode {
	case "", NetworkNone:
		return NetworkNone, nil
	case NetworkEgress, NetworkAllowlist:
		if e.net == nil {
			return "", errdefs.Unavailablef("%s: mode %q needs the network subsystem, which did not start (%s); only %q works", field, mode, e.netErr, NetworkNone)
		}
		return mode, nil
	default:
		return "", errdefs.Invalidf("%s: must be %s, %s or %s, got %q", field, NetworkNone, NetworkEgress, NetworkAllowlist, mode)
	}
}

// checkArgs and checkEnv are apitypes' checks, shared with the services
// under pkg/services.
var (
	checkArgs = apitypes.CheckArgs
	checkEnv  = apitypes.CheckEnv
)
