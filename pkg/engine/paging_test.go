package engine

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestPageJobOutput: a page that ends inside a multi-byte character ends
// before it instead, and the next offset points at its first byte, so that
// paging through the output never yields invalid UTF-8; a full page says
// more.
func TestPageJobOutput(t *testing.T) {
	text := strings.Repeat("é€😀", 50) // 2-, 3- and 4-byte runes
	for max := 1; max <= 40; max++ {
		var got strings.Builder
		off := int64(0)
		for pages := 0; off < int64(len(text)); pages++ {
			if pages > len(text) {
				t.Fatalf("max %d: paging does not advance at offset %d", max, off)
			}
			end := min(int(off)+max, len(text))
			st := &apitypes.JobStatus{Stdout: text[off:end], StdoutOffset: off, NextStdoutOffset: int64(end)}
			pageJobOutput(st, max)
			if st.NextStdoutOffset <= off {
				t.Fatalf("max %d: next offset %d does not pass %d", max, st.NextStdoutOffset, off)
			}
			if max >= utf8.UTFMax && !utf8.ValidString(st.Stdout) {
				t.Fatalf("max %d: page at %d is not valid UTF-8: %q", max, off, st.Stdout)
			}
			if st.More != (end-int(off) >= max) {
				t.Fatalf("max %d: more = %v for a page of %d bytes", max, st.More, end-int(off))
			}
			got.WriteString(st.Stdout)
			off = st.NextStdoutOffset
		}
		if got.String() != text {
			t.Fatalf("max %d: pages joined differ from the output", max)
		}
	}
	// Stderr is paged the same way.
	st := &apitypes.JobStatus{Stderr: "ab\xe2\x82", NextStderrOffset: 4}
	pageJobOutput(st, 4)
	if st.Stderr != "ab" || st.NextStderrOffset != 2 || !st.More {
		t.Fatalf("stderr page = %q next %d more %v, want \"ab\" 2 true", st.Stderr, st.NextStderrOffset, st.More)
	}
}

// TestPageEntries: a listing longer than the cap says it was cut and how
// long it is; a shorter one is whole, and an empty one is [] not null. The
// agent's count of what it did not send is the total.
func TestPageEntries(t *testing.T) {
	entries := make([]FileEntry, 5)
	if l := pageEntries(entries, 5, 3); len(l.Entries) != 3 || l.Total != 5 || !l.Truncated {
		t.Fatalf("cut listing = %d entries, total %d, truncated %v", len(l.Entries), l.Total, l.Truncated)
	}
	if l := pageEntries(entries, 5, 5); len(l.Entries) != 5 || l.Total != 5 || l.Truncated {
		t.Fatalf("whole listing = %d entries, total %d, truncated %v", len(l.Entries), l.Total, l.Truncated)
	}
	if l := pageEntries(nil, 0, 5); l.Entries == nil || l.Total != 0 || l.Truncated {
		t.Fatalf("empty listing = %+v", l)
	}
	if l := pageEntries(entries[:3], 100_500, 3); len(l.Entries) != 3 || l.Total != 100_500 || !l.Truncated {
		t.Fatalf("listing cut by the agent = %d entries, total %d, truncated %v", len(l.Entries), l.Total, l.Truncated)
	}
	if l := pageEntries(entries, 2, 10); len(l.Entries) != 5 || l.Total != 5 || l.Truncated {
		t.Fatalf("a total below the entries = %d entries, total %d, truncated %v", len(l.Entries), l.Total, l.Truncated)
	}
}
