package store

import (
	"context"
	"errors"
	"testing"
)

// TestIDRanges: each sandbox gets its own slot, asking again keeps it, the
// pool runs out with ErrNoIDRange, a released slot is reused lowest first,
// and a reopened database still knows every held slot.
func TestIDRanges(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	got := map[string]int{}
	for _, id := range []string{"sb-a", "sb-b", "sb-c"} {
		slot, err := s.AcquireIDRange(ctx, id, 3)
		if err != nil {
			t.Fatal(err)
		}
		got[id] = slot
	}
	if got["sb-a"] != 0 || got["sb-b"] != 1 || got["sb-c"] != 2 {
		t.Errorf("slots %v, want 0, 1, 2", got)
	}
	if slot, err := s.AcquireIDRange(ctx, "sb-b", 3); err != nil || slot != 1 {
		t.Errorf("sb-b again: %d %v, want its slot 1", slot, err)
	}
	if _, err := s.AcquireIDRange(ctx, "sb-d", 3); !errors.Is(err, ErrNoIDRange) {
		t.Errorf("a fourth range of three: %v, want ErrNoIDRange", err)
	}
	if err := s.ReleaseIDRange(ctx, "sb-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseIDRange(ctx, "sb-b"); err != nil {
		t.Errorf("releasing twice: %v", err)
	}
	if slot, err := s.AcquireIDRange(ctx, "sb-d", 3); err != nil || slot != 1 {
		t.Errorf("sb-d after sb-b's release: %d %v, want slot 1", slot, err)
	}
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	held, err := s2.IDRanges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 3 || held["sb-a"] != 0 || held["sb-d"] != 1 || held["sb-c"] != 2 {
		t.Errorf("after reopening: %v", held)
	}
	if _, err := s2.AcquireIDRange(ctx, "sb-e", 3); !errors.Is(err, ErrNoIDRange) {
		t.Errorf("after reopening, a fourth range: %v, want ErrNoIDRange", err)
	}
}
