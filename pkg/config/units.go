package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ByteSize is a size in bytes written in YAML as "512M", "1G", "64KiB" or
// "1048576". Suffixes are binary whatever their spelling (K = KB = KiB = 1024),
// because every size in this file is a kernel limit and the kernel counts in
// pages of powers of two; nobody means 10^9 when they write a memory limit.
type ByteSize int64

// sizeUnits maps every accepted suffix, lower-cased, to its multiplier.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

// ParseByteSize parses a size as ByteSize documents: a non-negative number,
// optionally with a fraction ("1.5G"), and an optional unit. Fractions of a
// byte are dropped.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("invalid size %q (use K, M, G, T)", s)
	}
	// Whole numbers are parsed as integers so that large exact byte counts
	// keep every digit; only fractions go through float64.
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return ByteSize(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q (use K, M, G, T)", s)
	}
	if f*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return ByteSize(f * float64(mult)), nil
}

// String formats b with the largest binary unit that divides it exactly, so
// that String and ParseByteSize round-trip.
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
// b is left unchanged on error.
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

// Duration is a time.Duration written in YAML as "30s", "5m", "1h30m"; "0"
// means none. Negative durations are refused: every duration in the
// configuration is a timeout or a lifetime.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration without the trailing zero units
// ("5m", not "5m0s"), and zero as "0".
func (d Duration) String() string {
	if d == 0 {
		return "0"
	}
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// UnmarshalText implements encoding.TextUnmarshaler. d is left unchanged on
// error.
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
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }
