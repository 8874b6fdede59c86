package api

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// TestWireCompatibility checks that the client's own types for the REST
// API's envelopes and requests (the shared objects live in pkg/apitypes) read
// and write the JSON the daemon uses: every field survives a round trip
// through the other side's type, and the receiving side knows every field the
// sending side writes.
func TestWireCompatibility(t *testing.T) {
	code := 3
	result := &sandbox.ExecResult{
		JobID: "j", ExitCode: 3, Stdout: "o", Stderr: "e", StdoutTruncated: true, StderrTruncated: true,
		StdoutBytes: 1, StderrBytes: 2, DurationMS: 4,
		Termination: sandbox.Termination{Cause: "exited", ExitCode: &code, Signal: "SIGX", Detail: "d"},
	}
	timeout := 1.5
	for _, tc := range []struct {
		name     string
		from, to any // from is marshalled, decoded strictly into to
	}{
		{"file result", &engine.FileResult{Path: "/p", Size: 1}, &client.FileResult{}},
		{"health", &apitypes.Health{Status: "ok", Version: "v", UptimeS: 1}, &client.Health{}},
		{"readiness", &apitypes.Readiness{Status: "ready", Checks: []engine.Check{{Name: "n"}}}, &client.Readiness{}},
		{"error", &errorResponse{Error: errorBody{Code: "c", Message: "m"}}, &client.ErrorResponse{}},
		{"exec output line", &execLine{Stream: "stdout", Data: "eA==", Encoding: "base64"}, &client.ExecLine{}},
		{"exec exit line", ptr(exitLine(result)), &client.ExecLine{}},
		{"exec error line", &execLine{Error: &errorBody{Code: "c", Message: "m"}}, &client.ExecLine{}},
		{"terminal exit", &terminalMessage{Type: "exit", ExitCode: &code, Termination: &result.Termination,
			Error: &errorBody{Code: "c", Message: "m"}}, &client.TerminalMessage{}},
		// Requests go the other way.
		{"exec request", &client.ExecRequest{Command: "c", Cwd: "/w", Env: map[string]string{"A": "1"}, Stdin: "in",
			TimeoutSeconds: &timeout}, &engine.ExecRequest{}},
		{"resize", &client.TerminalMessage{Type: "resize", Rows: 50, Cols: 100}, &terminalMessage{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := json.Marshal(tc.from)
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(in))
			dec.DisallowUnknownFields()
			if err := dec.Decode(tc.to); err != nil {
				t.Fatalf("decode %s into %T: %v", in, tc.to, err)
			}
			out, err := json.Marshal(tc.to)
			if err != nil {
				t.Fatal(err)
			}
			var a, b any
			_ = json.Unmarshal(in, &a)
			_ = json.Unmarshal(out, &b)
			if !reflect.DeepEqual(dropEmpty(a), dropEmpty(b)) {
				t.Errorf("round trip through %T changed the JSON:\n in: %s\nout: %s", tc.to, in, out)
			}
		})
	}
}

// dropEmpty removes empty strings from JSON objects: one side may omit a
// field the other always writes (the client's stdout on an exit line, the
// engine's sandbox_id that REST takes from the path).
func dropEmpty(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	for k, x := range m {
		if x == "" {
			delete(m, k)
			continue
		}
		m[k] = dropEmpty(x)
	}
	return m
}

// streamLines feeds output chunks ({stream, data}) through an execStream
// and returns the lines it wrote.
func streamLines(t *testing.T, chunks [][2]string) []client.ExecLine {
	t.Helper()
	w := httptest.NewRecorder()
	st := &execStream{ndjsonStream: newNDJSONStream(w)}
	for _, c := range chunks {
		st.output(c[0], []byte(c[1]))
	}
	st.flush()
	var lines []client.ExecLine
	dec := json.NewDecoder(w.Body)
	for dec.More() {
		var l client.ExecLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return lines
}

func TestExecStreamEncoding(t *testing.T) {
	type line struct{ stream, data, encoding string }
	for _, tc := range []struct {
		name   string
		chunks [][2]string
		want   []line
	}{
		{"ascii", [][2]string{{"stdout", "hi\n"}, {"stderr", "oops"}},
			[]line{{"stdout", "hi\n", ""}, {"stderr", "oops", ""}}},
		{"character split across chunks", [][2]string{{"stdout", "a\xc3"}, {"stdout", "\xbcb"}},
			[]line{{"stdout", "a", ""}, {"stdout", "üb", ""}}},
		{"four-byte character in three chunks", [][2]string{{"stdout", "\xf0\x9f"}, {"stdout", "\x98"}, {"stdout", "\x80!"}},
			[]line{{"stdout", "😀!", ""}}},
		{"streams held apart", [][2]string{{"stdout", "\xc3"}, {"stderr", "e"}, {"stdout", "\xa9"}},
			[]line{{"stderr", "e", ""}, {"stdout", "é", ""}}},
		{"binary", [][2]string{{"stdout", "\xff\x00\xfe"}},
			[]line{{"stdout", "/wD+", "base64"}}},
		{"dangling lead byte at the end", [][2]string{{"stdout", "x\xe2\x82"}},
			[]line{{"stdout", "x", ""}, {"stdout", "4oI=", "base64"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []line
			for _, l := range streamLines(t, tc.chunks) {
				got = append(got, line{l.Stream, l.Data, l.Encoding})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
		})
	}
}

func TestIncompleteRune(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"abc", 0}, {"ü", 0}, {"a\xc3", 1}, {"\xe2\x82", 2}, {"\xf0\x9f\x98", 3},
		{"😀", 0}, {"\xff", 0}, {"\x80\x80\x80\x80", 0},
	} {
		if got := incompleteRune([]byte(tc.in)); got != tc.want {
			t.Errorf("incompleteRune(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestDecodeJSONNamesTheProblem(t *testing.T) {
	s := &server{opt: Options{MaxBodyBytes: 16}}
	for _, tc := range []struct{ body, want string }{
		{`{"command":"x","argv":["a"]}`, "larger than 16 bytes"},
		{`{"cmd":"x"}`, `unknown field "cmd"`},
		{`[1]`, "body: want an object, got JSON array"},
		{`{"argv":"x"}`, "argv: want an array of string, got JSON string"},
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
		var req engine.ExecRequest
		err := s.decodeJSON(httptest.NewRecorder(), r, &req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("decode %s: %v, want %q", tc.body, err, tc.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }
