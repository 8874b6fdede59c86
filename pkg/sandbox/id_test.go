package sandbox_test

import (
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// An id of a named node carries the node's tag, survives the E2B form
// and every check ids pass today; a lone daemon's id carries none.
func TestNodeTagInIDs(t *testing.T) {
	id := sandbox.NewID("node-a")
	tag, ok := sandbox.IDNodeTag(id)
	if !ok || tag != sandbox.NodeTag("node-a") {
		t.Fatalf("sandbox.IDNodeTag(%q) = %q, %v; want %q", id, tag, ok, sandbox.NodeTag("node-a"))
	}
	if sandbox.NodeTag("node-a") == sandbox.NodeTag("node-b") {
		t.Fatal("two node names share a tag")
	}
	if err := sandbox.CheckID(id); err != nil {
		t.Fatal(err)
	}
	back, ok := e2b.FromE2B(e2b.ToE2B(id))
	if !ok || back != id {
		t.Fatalf("E2B round trip of %q: %q, %v", id, back, ok)
	}
	if !strings.HasPrefix(id, "sb-") {
		t.Fatalf("id %q lost its sb- prefix", id)
	}
	if tag, ok := sandbox.IDNodeTag(sandbox.NewID("")); ok {
		t.Fatalf("a lone daemon's id carries tag %q", tag)
	}
	for _, bad := range []string{"", "sb-", "sb-ZZZZZZZZ000000000000", "sb-../../etc/passwd0000", "xx-0123456789abcdef0123"} {
		if tag, ok := sandbox.IDNodeTag(bad); ok {
			t.Errorf("sandbox.IDNodeTag(%q) = %q, want none", bad, tag)
		}
	}
}
