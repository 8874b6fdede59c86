package gateway

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

func node(name string, live int, mut func(*probed)) probed {
	p := probed{node: Node{Name: name, Ready: true}, st: &apitypes.NodeStatus{
		Name: name, Ready: true, Live: live, MaxSandboxes: 10, MemoryBytes: 8 << 30, CPUs: 2, Images: []string{"shell", "python"},
	}}
	if mut != nil {
		mut(&p)
	}
	return p
}

// TestPlace: a create goes to the least-loaded node that fits; draining,
// not ready, full, silent and VM-less nodes get none; one that holds the
// image wins over one that would build it; nothing fits → unavailable
// naming each node's reason.
func TestPlace(t *testing.T) {
	mem := func(mb int64) *int64 { return &mb }
	for _, tc := range []struct {
		name   string
		probes []probed
		h      placeHints
		want   string
	}{
		{"least loaded", []probed{node("a", 3, nil), node("b", 1, nil), node("c", 2, nil)}, placeHints{}, "b"},
		{"draining skipped", []probed{node("a", 3, nil), node("b", 1, func(p *probed) { p.st.Draining = true })}, placeHints{}, "a"},
		{"discovery draining skipped", []probed{node("a", 3, nil), node("b", 1, func(p *probed) { p.node.Draining = true })}, placeHints{}, "a"},
		{"not ready skipped", []probed{node("a", 3, nil), node("b", 1, func(p *probed) { p.st.Ready = false })}, placeHints{}, "a"},
		{"silent skipped", []probed{node("a", 3, nil), node("b", 1, func(p *probed) { p.err = errors.New("refused") })}, placeHints{}, "a"},
		{"full skipped", []probed{node("a", 9, nil), node("b", 10, nil)}, placeHints{}, "a"},
		{"memory", []probed{node("a", 5, nil), node("b", 1, func(p *probed) { p.st.MemoryCommittedBytes = 8<<30 - 100<<20 })}, placeHints{MemoryMB: mem(512)}, "a"},
		{"vm", []probed{node("a", 5, func(p *probed) { p.st.VM = true }), node("b", 1, nil)}, placeHints{Backend: "vm"}, "a"},
		{"image present wins", []probed{node("a", 5, func(p *probed) { p.st.Images = append(p.st.Images, "rust") }), node("b", 1, nil)}, placeHints{Language: "rust"}, "a"},
		{"image nowhere: least loaded", []probed{node("a", 5, nil), node("b", 1, nil)}, placeHints{Image: "ruby"}, "b"},
		{"nothing fits", []probed{node("a", 10, nil), node("b", 1, func(p *probed) { p.st.Draining = true })}, placeHints{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := place(tc.probes, tc.h)
			if tc.want == "" {
				if !errdefs.Is(err, errdefs.Unavailable) || err.Error() == "" {
					t.Fatalf("place = %v, %v; want unavailable", n.Name, err)
				}
				if msg := errdefs.MessageOf(err); msg != "no node takes this sandbox (a: full; b: draining)" {
					t.Errorf("message %q", msg)
				}
				return
			}
			if err != nil || n.Name != tc.want {
				t.Fatalf("place = %q, %v; want %q", n.Name, err, tc.want)
			}
		})
	}
}

// Ties are broken at random: over many placements on equal nodes every
// node gets some.
func TestPlaceSpreadsTies(t *testing.T) {
	got := map[string]int{}
	for range 300 {
		n, err := place([]probed{node("a", 1, nil), node("b", 1, nil), node("c", 1, nil)}, placeHints{})
		if err != nil {
			t.Fatal(err)
		}
		got[n.Name]++
	}
	for _, name := range []string{"a", "b", "c"} {
		if got[name] < 50 {
			t.Errorf("node %s got %d of 300 tied placements: %v", name, got[name], got)
		}
	}
}

// TestCheckTags: distinct (or repeated) names pass; names whose tags
// collide are refused, naming both (a one-character tag forces one).
func TestCheckTags(t *testing.T) {
	if err := CheckTags([]Node{{Name: "node-1"}, {Name: "node-2"}, {Name: "node-1"}}); err != nil {
		t.Fatalf("distinct or repeated names: %v", err)
	}
	short := func(name string) string { return sandbox.NodeTag(name)[:1] }
	var nodes []Node
	for i := range 17 { // 17 names, 16 one-digit tags: a collision
		nodes = append(nodes, Node{Name: fmt.Sprintf("node-%d", i)})
	}
	err := checkTags(nodes, short)
	if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "share the id tag") {
		t.Fatalf("colliding tags: %v", err)
	}
}
