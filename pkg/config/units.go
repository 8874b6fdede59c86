package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ByteSize is a size in bytes written in YAML as "512M", "1G", "64KiB", "1048576".
// Suffixes are binary (K = KiB = 1024).
type ByteSize int64

// ParseByteSize parses a size as ByteSize documents.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("unknown size unit in %q (use K, M, G, T)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return ByteSize(f * mult), nil
}

// String formats b with the largest exact binary unit.
func (b ByteSize) String() string {
	for _, u := range []struct {
		s string
		n int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if b != 0 && int64(b)%u.n == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.n, u.s)
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// UnmarshalText implements encoding.TextUnmarshaler (YAML and env overrides).
func (b *ByteSize) UnmarshalText(p []byte) error {
	v, err := ParseByteSize(string(p))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// Duration is a time.Duration written in YAML as "30s", "5m", "1h30m"; "0" means none.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(p []byte) error {
	s := strings.TrimSpace(string(p))
	if s == "0" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q (use e.g. 30s, 5m, 1h)", s)
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) {
	if d == 0 {
		return []byte("0"), nil
	}
	return []byte(time.Duration(d).String()), nil
}
