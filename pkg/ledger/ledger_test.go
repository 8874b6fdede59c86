package ledger

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

func TestReleaseWalksBackwardsAndKeepsFailures(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := New(db)
	var order []string
	failing := true
	l.Register("dir", func(_ context.Context, r Resource) error { order = append(order, "dir "+r.Key); return nil })
	l.Register("mount", func(_ context.Context, r Resource) error {
		order = append(order, "mount "+r.Key)
		if failing && r.Key == "busy" {
			return errors.New("device busy")
		}
		return nil
	})
	if err := l.Record(ctx, "sb-1", Resource{Kind: "nope", Key: "x"}); err == nil {
		t.Fatal("recording a kind without a releaser must fail")
	}
	rec := l.For("sb-1")
	for _, r := range []Resource{{Kind: "dir", Key: "/a"}, {Kind: "mount", Key: "busy"}, {Kind: "mount", Key: "/a/m", Data: []byte(`{"x":1}`)}, {Kind: "dir", Key: "/a"}} {
		if err := rec.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.For("sb-2").Record(ctx, Resource{Kind: "dir", Key: "/b"}); err != nil {
		t.Fatal(err)
	}
	res, err := l.Resources(ctx, "sb-1")
	if err != nil || len(res) != 3 || string(res[2].Data) != `{"x":1}` {
		t.Fatalf("Resources = %+v, %v (a duplicate record must keep one row)", res, err)
	}
	owners, _ := l.Owners(ctx)
	if !slices.Equal(owners, []string{"sb-1", "sb-2"}) {
		t.Fatalf("Owners = %v", owners)
	}

	// The scan found the dir (recorded) and a cgroup-like extra resource.
	out, err := l.Release(ctx, "sb-1", Resource{Kind: "dir", Key: "/a"}, Resource{Kind: "dir", Key: "/extra"})
	if err == nil || len(out) != 4 {
		t.Fatalf("Release = %+v, %v; want 4 results and the busy mount's error", out, err)
	}
	if want := []string{"mount /a/m", "mount busy", "dir /a", "dir /extra"}; !slices.Equal(order, want) {
		t.Fatalf("release order %v, want %v", order, want)
	}
	left, _ := l.Resources(ctx, "sb-1")
	if len(left) != 1 || left[0].Key != "busy" {
		t.Fatalf("after a failed release the ledger holds %+v, want only the busy mount", left)
	}
	failing = false
	if _, err := l.Release(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if left, _ := l.Resources(ctx, "sb-1"); len(left) != 0 {
		t.Fatalf("ledger not empty: %+v", left)
	}
	if owners, _ := l.Owners(ctx); !slices.Equal(owners, []string{"sb-2"}) {
		t.Fatalf("Owners after release = %v", owners)
	}
}

// TestClaim: owners under a claimed prefix are a service's, others not.
func TestClaim(t *testing.T) {
	l := New(nil)
	if l.Claimed("vol-a") {
		t.Fatal("claimed before Claim")
	}
	l.Claim("vol-")
	if !l.Claimed("vol-a") || l.Claimed("sb-1") || l.Claimed("vo") {
		t.Errorf("Claimed: vol-a %v, sb-1 %v, vo %v", l.Claimed("vol-a"), l.Claimed("sb-1"), l.Claimed("vo"))
	}
}

// TestReleaseStrikesRowsAfterTheirResources: every row is still in the
// ledger while its resource is being released (a crash there leaves it
// recorded), all are struck together afterwards, and a failed strike is
// reported against each released resource while the rows stay for the
// next release.
func TestReleaseStrikesRowsAfterTheirResources(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	l := New(db)
	var (
		seen     [][]string
		closeNow bool
	)
	l.Register("r", func(ctx context.Context, r Resource) error {
		res, err := l.Resources(ctx, "sb-1")
		if err != nil {
			return err
		}
		var keys []string
		for _, x := range res {
			keys = append(keys, x.Key)
		}
		seen = append(seen, keys)
		if closeNow && r.Key == "a" {
			db.Close() // the strike after the walk fails
		}
		return nil
	})
	for _, k := range []string{"a", "b", "c"} {
		if err := l.For("sb-1").Record(ctx, Resource{Kind: "r", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Release(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	all := []string{"a", "b", "c"}
	if len(seen) != 3 || !slices.Equal(seen[0], all) || !slices.Equal(seen[1], all) || !slices.Equal(seen[2], all) {
		t.Fatalf("rows seen by each release: %v, want every row still recorded while any resource is released", seen)
	}
	if left, _ := l.Resources(ctx, "sb-1"); len(left) != 0 {
		t.Fatalf("rows left after release: %+v", left)
	}

	for _, k := range all {
		if err := l.For("sb-1").Record(ctx, Resource{Kind: "r", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	closeNow = true
	out, err := l.Release(ctx, "sb-1")
	if err == nil {
		t.Fatal("Release with a failed strike returned no error")
	}
	if len(out) != 3 {
		t.Fatalf("Release = %+v, want 3 results", out)
	}
	for _, r := range out {
		if r.Err == nil {
			t.Errorf("%s: no error, though its row could not be struck", r.Resource)
		}
	}
	db2, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if left, _ := New(db2).Resources(ctx, "sb-1"); len(left) != 3 {
		t.Fatalf("rows after a failed strike: %+v, want all three for the next release", left)
	}
}

// TestStagedRelease: a staged releaser's finishing part runs while the
// walk goes on to older resources, the release waits for it, and its row
// goes only when it succeeded.
func TestStagedRelease(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := New(db)
	var (
		mu        sync.Mutex
		order     []string
		errFinish = errors.New("cgroup busy")
		release   = make(chan struct{}) // lets the finishing part end
	)
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	l.RegisterStaged("container", func(_ context.Context, r Resource) (func() error, error) {
		note("kill " + r.Key)
		return func() error {
			<-release // held until the walk reached the older resource
			note("destroy " + r.Key)
			if r.Key == "bad" {
				return errFinish
			}
			return nil
		}, nil
	})
	l.Register("mount", func(_ context.Context, r Resource) error {
		note("unmount " + r.Key)
		close(release) // the walk got here while destroy was still waiting
		return nil
	})
	rec := l.For("sb-1")
	for _, r := range []Resource{{Kind: "mount", Key: "/m"}, {Kind: "container", Key: "good"}} {
		if err := rec.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	out, err := l.Release(ctx, "sb-1")
	if err != nil || len(out) != 2 {
		t.Fatalf("Release = %+v, %v", out, err)
	}
	if want := []string{"kill good", "unmount /m", "destroy good"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v (the finishing part overlapping the walk, waited for)", order, want)
	}
	if left, _ := l.Resources(ctx, "sb-1"); len(left) != 0 {
		t.Fatalf("rows left: %+v", left)
	}

	// A failing finishing part: its row stays, the error names it.
	order, release = nil, make(chan struct{})
	for _, r := range []Resource{{Kind: "mount", Key: "/m"}, {Kind: "container", Key: "bad"}} {
		if err := rec.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	out, err = l.Release(ctx, "sb-1")
	if !errors.Is(err, errFinish) || len(out) != 2 || !errors.Is(out[0].Err, errFinish) || out[1].Err != nil {
		t.Fatalf("Release = %+v, %v; want the container's finishing error on its result only", out, err)
	}
	left, _ := l.Resources(ctx, "sb-1")
	if len(left) != 1 || left[0].Key != "bad" {
		t.Fatalf("rows left: %+v, want the container's only", left)
	}
}
