package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// TestRunStream: POST /v1/run?stream=true sends each step's output as it
// is written, then the result; the run record returns the code snapshot.
func TestRunStream(t *testing.T) {
	ts := newTestServer(t)
	id := ts.createSandbox(t)
	const script = "echo first\nsleep 1\necho second >&2\nexit 3\n"
	body, _ := json.Marshal(map[string]any{"language": "shell", "sandbox_id": id, "files": map[string]string{"main.sh": script}})
	start := time.Now()
	resp := ts.request(t, http.MethodPost, "/v1/run?stream=true", strings.NewReader(string(body)), true)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	type line struct {
		Stream, Data string
		Result       *client.RunResult
		Error        *client.ErrorBody
	}
	var (
		firstAt, resultAt time.Duration
		stdout, stderr    string
		result            *client.RunResult
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch {
		case l.Stream == "stdout":
			if firstAt == 0 {
				firstAt = time.Since(start)
			}
			stdout += l.Data
		case l.Stream == "stderr":
			stderr += l.Data
		case l.Result != nil:
			result, resultAt = l.Result, time.Since(start)
		case l.Error != nil:
			t.Fatalf("error line: %+v", l.Error)
		}
	}
	if result == nil {
		t.Fatal("no result line")
	}
	if stdout != "first\n" || stderr != "second\n" || result.ExitCode != 3 || result.Success {
		t.Fatalf("stdout %q stderr %q result %+v", stdout, stderr, result)
	}
	// The first line came while the program still slept: it was streamed.
	if resultAt-firstAt < 700*time.Millisecond {
		t.Errorf("stdout arrived at %v, the result at %v: not streamed", firstAt, resultAt)
	}

	rec, err := ts.tcp.Run(context.Background(), result.RunID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Code["main.sh"] != script || len(rec.Code) != 1 || rec.CodeTruncated {
		t.Errorf("run record code %q (truncated %v), want main.sh = %q", rec.Code, rec.CodeTruncated, script)
	}

	// Refused before any output: an ordinary error status.
	resp = ts.request(t, http.MethodPost, "/v1/run?stream=true", strings.NewReader(`{"language":"cobol","code":"x"}`), true)
	if e := decodeError(t, resp); resp.StatusCode != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, "language") {
		t.Errorf("unknown language: %d %+v", resp.StatusCode, e)
	}
	resp = ts.request(t, http.MethodPost, "/v1/run?stream=maybe", strings.NewReader(`{}`), true)
	if e := decodeError(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Message, "stream") {
		t.Errorf("stream=maybe: %d %+v", resp.StatusCode, e)
	}
}
