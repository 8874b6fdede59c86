package engine

import (
	"context"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Paging of what the front ends hand out in pieces (job output, directory
// listings), done here once so that REST, MCP and the web editor page alike.

// MaxListEntries is the most entries a listing can hold: what the sandbox
// agent sends at most.
const MaxListEntries = agent.MaxListEntries

// ArtifactPath is where REST serves an exported archive.
func ArtifactPath(id string) string { return "/v1/artifacts/" + id }

// ListFilesPage lists a directory in a sandbox (default /workspace) up to
// req.MaxEntries (default apitypes.DefaultListEntries), saying how many
// entries there are and whether some were left out, so that a client can
// tell an incomplete list from a complete one. The agent sends no more
// than that and counts the rest, so a huge directory costs its count, not
// its entries.
func (e *Engine) ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	max := req.MaxEntries
	switch {
	case max < 0:
		return nil, errdefs.Invalidf("max_entries: must not be negative")
	case max == 0:
		max = apitypes.DefaultListEntries
	case max > MaxListEntries:
		return nil, errdefs.Invalidf("max_entries: exceeds the maximum %d", MaxListEntries)
	}
	p, err := e.listPath(ctx, req.SandboxID, req.Path)
	if err != nil {
		return nil, err
	}
	l, err := e.sandboxes.ListFilesMax(ctx, req.SandboxID, p, req.Recursive, max)
	if err != nil {
		return nil, err
	}
	entries := make([]FileEntry, len(l.Entries))
	for i, f := range l.Entries {
		entries[i] = FileEntry{Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode, MTime: f.MTime}
	}
	return pageEntries(entries, l.Total, max), nil
}

// pageEntries is the first limit of entries, of a listing of total
// entries (never fewer than entries holds).
func pageEntries(entries []FileEntry, total, limit int) *apitypes.FileList {
	out := &apitypes.FileList{Entries: entries, Total: max(total, len(entries))}
	if out.Entries == nil {
		out.Entries = []FileEntry{}
	}
	if len(out.Entries) > limit {
		out.Entries = out.Entries[:limit]
	}
	out.Truncated = out.Total > len(out.Entries)
	return out
}

// pageJobOutput ends each stream's page of st on a rune boundary: an
// incomplete UTF-8 sequence at the end of a page is held back (the next
// offset moves back over it) for the next page, so that text never
// arrives split into two invalid halves. A page that is nothing but such
// a tail is sent as it is, so that paging always advances. More says a
// page was full (max bytes): more output may be waiting.
func pageJobOutput(st *apitypes.JobStatus, max int) {
	st.More = len(st.Stdout) >= max || len(st.Stderr) >= max
	if n := incompleteTail(st.Stdout); n > 0 && len(st.Stdout) > n {
		st.Stdout, st.NextStdoutOffset = st.Stdout[:len(st.Stdout)-n], st.NextStdoutOffset-int64(n)
	}
	if n := incompleteTail(st.Stderr); n > 0 && len(st.Stderr) > n {
		st.Stderr, st.NextStderrOffset = st.Stderr[:len(st.Stderr)-n], st.NextStderrOffset-int64(n)
	}
}

// incompleteTail is how many bytes at the end of b begin a UTF-8 sequence
// that b does not finish (0 when b ends on a rune boundary).
func incompleteTail(b string) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		c := b[len(b)-i]
		if utf8.RuneStart(c) {
			if c >= 0x80 && !utf8.FullRuneInString(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}
