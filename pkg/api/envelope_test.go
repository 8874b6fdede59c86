package api

import (
	"context"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestEnvelopeOverREST, on a real sandbox: a listing cut at max_entries
// says so and how long it is (issue 20: REST listed a huge directory with
// neither), the exec stream's exit line carries the command's usage, and a
// job's pages never split a UTF-8 character.
func TestEnvelopeOverREST(t *testing.T) {
	ts := newTestServer(t)
	id := ts.createSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := ts.unix.Exec(ctx, id, client.ExecRequest{Command: "mkdir -p /workspace/many && cd /workspace/many && touch a b c d e"}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if res.Usage == nil {
		t.Errorf("exec over REST: no usage in the exit line: %+v", res)
	}
	l, err := ts.unix.ListFilesPage(ctx, apitypes.FileListRequest{SandboxID: id, Path: "/workspace/many", MaxEntries: 2})
	if err != nil || len(l.Entries) != 2 || l.Total != 5 || !l.Truncated {
		t.Fatalf("list with max_entries 2 = %+v, %v; want 2 of 5, truncated", l, err)
	}
	l, err = ts.unix.ListFilesPage(ctx, apitypes.FileListRequest{SandboxID: id, Path: "/workspace/many"})
	if err != nil || len(l.Entries) != 5 || l.Total != 5 || l.Truncated {
		t.Fatalf("whole list = %+v, %v", l, err)
	}

	// "é" is two bytes: pages of 3 bytes of "aé" repeated end inside one
	// unless the engine holds the tail back.
	jobID, err := ts.unix.StartJob(ctx, id, client.ExecRequest{Command: "printf 'aéaéaéaéaé'"})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var off int64
	for deadline := time.Now().Add(time.Minute); ; {
		st, err := ts.unix.JobStatus(ctx, id, jobID, off, 0, 4)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.ValidString(st.Stdout) {
			t.Fatalf("page at %d is not valid UTF-8: %q", off, st.Stdout)
		}
		out += st.Stdout
		if st.NextStdoutOffset == off {
			if st.State == apitypes.JobFinished {
				break
			}
			time.Sleep(50 * time.Millisecond) // running, nothing new yet
		}
		off = st.NextStdoutOffset
		if time.Now().After(deadline) {
			t.Fatal("job did not finish")
		}
	}
	if out != "aéaéaéaéaé" {
		t.Errorf("pages joined = %q", out)
	}
}
