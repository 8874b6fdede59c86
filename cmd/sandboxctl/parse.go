package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

const mib = 1 << 20

// parseMB parses a size like the daemon's configuration does ("512M", "1G",
// "1.5G") and returns it in MiB, the unit of the API's *_mb fields.
func parseMB(flag, s string) (int64, error) {
	b, err := config.ParseByteSize(s)
	if err != nil {
		return 0, usagef("--%s: %v", flag, err)
	}
	if b%mib != 0 {
		return 0, usagef("--%s: %q is not a whole number of MiB (use e.g. 512M or 1G)", flag, s)
	}
	return int64(b) / mib, nil
}

// parseKV parses repeated NAME=VALUE flags into a map; later ones win.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s: want NAME=VALUE, got %q", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// seconds converts a duration flag to whole seconds, rounding up so that a
// sub-second duration does not become "no limit".
func seconds(flag string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, usagef("--%s: must be positive, got %s", flag, d)
	}
	return int64(math.Ceil(d.Seconds())), nil
}

// location is one side of sandboxctl cp: a local path ("-" for stdin or
// stdout) or a path in a sandbox.
type location struct {
	sandbox string // "" for local
	path    string
}

func (l location) remote() bool { return l.sandbox != "" }

// parseLocation reads ID:/path as a sandbox path and anything else as a local
// one. Like docker cp, a local path that contains a colon can be written
// with a leading "./" or "/".
func parseLocation(s string) location {
	if s == "-" || strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return location{path: s}
	}
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return location{path: s}
	}
	return location{sandbox: id, path: p}
}

// parseCopy checks that exactly one side of a copy is in a sandbox.
func parseCopy(src, dst string) (from, to location, err error) {
	from, to = parseLocation(src), parseLocation(dst)
	switch {
	case from.remote() == to.remote():
		return from, to, usagef("cp: exactly one of SRC and DST must be ID:/path, got %q and %q", src, dst)
	case from.remote() && from.path == "", to.remote() && to.path == "":
		return from, to, usagef("cp: missing path after the sandbox ID")
	case from.path == "-" && to.path == "-":
		return from, to, usagef("cp: SRC and DST cannot both be -")
	}
	return from, to, nil
}

// humanBytes formats n with a binary unit and at most one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, u := float64(n), -1
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	s := fmt.Sprintf("%.1f", v)
	return strings.TrimSuffix(s, ".0") + string("KMGTP"[u]) + "iB"
}

// ago formats how long ago t was, coarsely, like docker ps.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case t.IsZero():
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}
