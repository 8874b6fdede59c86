package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestHugeDirectoryListing (issue 20): a directory of 100,500 entries in a
// real sandbox lists through REST and MCP as its first max_entries
// entries, with total 100500 and truncated, instead of an error from the
// agent's cap.
func TestHugeDirectoryListing(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t)
	d.Start()
	const n = 100_500
	// A tmpfs with room for the inodes (the default disk has one per
	// 16K: 65,536; the most for 1G is 131,072), so that creating the
	// files is quick.
	id := createSandbox(d, "--disk-backing", "memory", "--memory", "1G", "--inodes", "120000")
	start := time.Now()
	d.MustCtl("exec", id, "--", "sh", "-c",
		fmt.Sprintf("mkdir /workspace/big && cd /workspace/big && seq -f f%%06g 0 %d | xargs touch", n-1))
	if got := strings.TrimSpace(d.MustCtl("exec", id, "--", "sh", "-c", "ls -f /workspace/big | grep -c ^f")); got != fmt.Sprint(n) {
		t.Fatalf("the sandbox made %s files, want %d", got, n)
	}
	t.Logf("%d files made in %v", n, time.Since(start))

	check := func(how string, l apitypes.FileList, entries int) {
		t.Helper()
		if len(l.Entries) != entries || l.Total != n || !l.Truncated {
			t.Fatalf("%s: %d entries, total %d, truncated %v; want %d of %d, truncated", how, len(l.Entries), l.Total, l.Truncated, entries, n)
		}
		for i, e := range l.Entries {
			if want := fmt.Sprintf("/workspace/big/f%06d", i); e.Path != want || e.Type != "file" {
				t.Fatalf("%s: entry %d = %+v, want %s (the first in order)", how, i, e, want)
			}
		}
	}

	rest := func(query string) apitypes.FileList {
		t.Helper()
		start := time.Now()
		res, err := d.UnixGet("/v1/sandboxes/" + id + "/files?list=true&path=/workspace/big" + query)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET ...%s: %s (code %s)", query, res.Status, errorCode(t, res))
		}
		var l apitypes.FileList
		if err := json.NewDecoder(res.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		t.Logf("REST%s: %d of %d entries in %v", query, len(l.Entries), l.Total, time.Since(start))
		return l
	}
	check("REST default", rest(""), apitypes.DefaultListEntries)
	check("REST max_entries=1000", rest("&max_entries=1000"), 1000)
	check("REST max_entries=100000", rest("&max_entries=100000"), 100_000)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := mcpSession(ctx, t, d)
	defer c.Close()
	call := func(args map[string]any) apitypes.FileList {
		t.Helper()
		start := time.Now()
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = "file_list", args
		res, err := c.CallTool(ctx, req)
		if err != nil || res.IsError {
			t.Fatalf("file_list %v: %v %+v", args, err, res)
		}
		var l apitypes.FileList
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		t.Logf("MCP %v: %d of %d entries in %v", args, len(l.Entries), l.Total, time.Since(start))
		return l
	}
	// max_entries small enough for the tool result (mcp_max_result_bytes).
	check("MCP max_entries=100", call(map[string]any{"sandbox_id": id, "path": "/workspace/big", "max_entries": 100}), 100)
	// Without max_entries the result's size is the cut: some entries, the
	// first ones, and the count.
	l := call(map[string]any{"sandbox_id": id, "path": "/workspace/big"})
	if len(l.Entries) == 0 || len(l.Entries) >= n {
		t.Fatalf("MCP without max_entries: %d entries", len(l.Entries))
	}
	check("MCP without max_entries", l, len(l.Entries))
}
