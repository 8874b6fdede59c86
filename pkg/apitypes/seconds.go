package apitypes

import (
	"math"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Seconds turns a request's seconds into a duration, refusing what is not
// a positive finite number, what would overflow, and what exceeds max
// (0: no maximum).
func Seconds(field string, secs float64, max time.Duration) (time.Duration, error) {
	if !(secs > 0) || math.IsInf(secs, 0) {
		return 0, errdefs.Invalidf("%s: must be a positive number of seconds, got %v", field, secs)
	}
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return 0, errdefs.Invalidf("%s: %v seconds is out of range", field, secs)
	}
	d := time.Duration(secs * float64(time.Second))
	if max > 0 && d > max {
		return 0, errdefs.Invalidf("%s: %v exceeds the maximum %s", field, secs, max)
	}
	return d, nil
}
