package engine

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// A section whose subsystem is not built is refused, key by key, instead of
// being silently ignored; the network and vm sections are built now.
func TestConfigOfUnbuiltSubsystemsRefused(t *testing.T) {
	cfg := config.Default()
	cfg.Network.DefaultMode = "egress"
	cfg.VM.MaxVMs = 5
	cfg.VM.Accel = "tcg"
	if err := checkBuilt(cfg); err != nil {
		t.Errorf("network and vm settings refused: %v", err)
	}
	if err := checkBuilt(config.Default()); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
}

func TestDurationAndSizeValidators(t *testing.T) {
	for _, secs := range []float64{0, -1, math.NaN(), math.Inf(1), 1e300, float64(math.MaxInt64)} {
		if _, err := duration("timeout_seconds", secs, 0); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(errdefs.MessageOf(err), "timeout_seconds: ") {
			t.Errorf("duration(%v) = %v, want invalid_argument naming the field", secs, err)
		}
	}
	if d, err := duration("timeout_seconds", 1.5, time.Hour); err != nil || d != 1500*time.Millisecond {
		t.Errorf("duration(1.5) = %v, %v", d, err)
	}
	if _, err := duration("timeout_seconds", 7200, time.Hour); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("duration over the maximum = %v", err)
	}
	if _, err := wholeSeconds("ttl_seconds", math.MaxInt64, 0); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("wholeSeconds(MaxInt64) = %v, want invalid_argument, not a wrapped duration", err)
	}
	for _, mb := range []int64{math.MaxInt64, math.MaxInt64/(1<<20) + 1, math.MinInt64, -1, 1} {
		if _, err := megabytes("memory_mb", mb, 16<<20, 0); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("megabytes(%d) = %v, want invalid_argument", mb, err)
		}
	}
	if b, err := megabytes("memory_mb", 64, 16<<20, 1<<30); err != nil || b != 64<<20 {
		t.Errorf("megabytes(64) = %d, %v", b, err)
	}
}

func TestArgvSizeRefused(t *testing.T) {
	big := strings.Repeat("a", 128<<10)
	for name, tc := range map[string]struct {
		argv  []string
		env   map[string]string
		field string
	}{
		"one huge argument": {[]string{"echo", big}, nil, "argv[1]"},
		"many arguments":    {append([]string{"echo"}, slicesRepeat(strings.Repeat("b", 64<<10), 20)...), nil, "argv:"},
		"huge env variable": {[]string{"true"}, map[string]string{"X": big}, "env.X"},
		"fits":              {[]string{"echo", strings.Repeat("c", 100<<10)}, map[string]string{"Y": "z"}, ""},
	} {
		err := checkArgvSize(tc.argv, tc.env)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want invalid_argument naming %s", name, err, tc.field)
		}
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
