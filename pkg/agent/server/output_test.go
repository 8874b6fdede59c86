package server

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOutputRetainsTail(t *testing.T) {
	o := output{retain: 10}
	var all []byte
	for i := range 50 {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 3)
		all = append(all, p...)
		o.write(p)
		if len(o.buf) > 2*o.retain {
			t.Fatalf("buffer grew to %d bytes", len(o.buf))
		}
	}
	if o.end() != 150 || o.tail() != 140 {
		t.Fatalf("end %d tail %d", o.end(), o.tail())
	}
	for _, tc := range []struct {
		off, wantOff int64
		limit        int
		want         []byte
	}{
		{0, 140, 100, all[140:]},   // older than the tail: starts at the tail
		{145, 145, 100, all[145:]}, // inside the tail
		{141, 141, 4, all[141:145]},
		{150, 150, 100, nil}, // at the end
		{999, 999, 100, nil}, // beyond the end: no data, offset kept
	} {
		got, off := o.read(tc.off, tc.limit)
		if off != tc.wantOff || !bytes.Equal(got, tc.want) {
			t.Errorf("read(%d, %d) = %q at %d, want %q at %d", tc.off, tc.limit, got, off, tc.want, tc.wantOff)
		}
	}
	o.shrink()
	if len(o.buf) != 10 || o.start != 140 {
		t.Errorf("after shrink: %d bytes from %d", len(o.buf), o.start)
	}
	if got, _ := o.read(0, 100); !bytes.Equal(got, all[140:]) {
		t.Errorf("read after shrink: %q", got)
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]unix.Signal{
		"SIGTERM": unix.SIGTERM, "term": unix.SIGTERM, "KILL": unix.SIGKILL, "9": unix.SIGKILL, "SIGWINCH": unix.SIGWINCH,
	} {
		if got, err := parseSignal(in); err != nil || got != want {
			t.Errorf("parseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "65", "-9", "SIGNOPE", "SIG"} {
		if _, err := parseSignal(bad); err == nil {
			t.Errorf("parseSignal(%q) accepted", bad)
		}
	}
}
