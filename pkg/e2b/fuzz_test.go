package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process/processconnect"
)

// The fuzz targets of the E2B front end drive the whole handler (routing,
// authentication, decoding, validation) in process, over the fake backend
// of e2b_test.go; what reaches the backend is checked against the rules
// the engine applies after this front end, so a request validation lets
// through is one the engine takes.

// fuzzRoutes are the control-plane requests FuzzControlPlane sends its
// body or query to; the sandbox routes name sbFuzz, which exists.
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/sandboxes"},
	{"POST", "/v2/sandboxes"},
	{"POST", "/sandboxes/{id}/timeout"},
	{"POST", "/sandboxes/{id}/refreshes"},
	{"POST", "/sandboxes/{id}/connect"},
	{"GET", "/v2/sandboxes"},
	{"GET", "/sandboxes/{id}"},
}

// checkErrorBody: an E2B error answer is {code, message} with code the
// HTTP status (the JS SDK branches on it) and a message.
func checkErrorBody(t *testing.T, status int, raw []byte) {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(raw, &eb); err != nil || eb.Code != status || eb.Message == "" {
		t.Fatalf("status %d with body %q: not E2B's error object (%v)", status, raw, err)
	}
}

// FuzzControlPlane: every body of the create, timeout and connect routes
// and every query of the list is answered with a success or E2B's error
// object with a 4xx status (never a 5xx: the backend never fails here);
// a create that succeeds hands the engine a request it accepts (a positive
// TTL, the metadata as labels) and answers with the metadata as sent.
func FuzzControlPlane(f *testing.F) {
	for _, s := range []struct {
		route uint8
		body  string
	}{
		{0, `{"templateID":"base","timeout":300,"metadata":{"user":"a","run":"1"},"envVars":{"A":"b"},"secure":true}`},
		{1, `{"templateID":"base","timeout":15,"autoPause":true,"allow_internet_access":false}`},
		{0, `{"templateID":"python:3"}`}, {0, `{"templateID":"base","timeout":0}`}, {1, `{"templateID":"base","timeout":-1}`},
		{2, `{"timeout":60}`}, {3, `{"duration":30}`}, {4, `{}`}, {4, ``}, {2, `{"timeout":"60"}`}, {0, `[`},
	} {
		f.Add(s.route, []byte(s.body), "")
	}
	f.Add(uint8(5), []byte(nil), "state=running,paused&limit=10&metadata="+url.QueryEscape("user=a&run=1"))
	f.Add(uint8(5), []byte(nil), "metadata=%zz&limit=0")
	f.Add(uint8(5), []byte(nil), "nextToken=sb00&state=dead")
	fb := newFake()
	s := New(fb, Options{Keys: []string{testKey}})
	defer s.Close()
	// One live E2B sandbox for the routes that name one.
	exp := int64(300)
	sb, err := fb.CreateSandbox(context.Background(), apitypes.CreateSandboxRequest{Image: "base", TTLSeconds: &exp, Labels: map[string]string{labelTemplate: "base"}})
	if err != nil {
		f.Fatal(err)
	}
	sbFuzz := ToE2B(sb.ID)
	f.Fuzz(func(t *testing.T, route uint8, body []byte, query string) {
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		target := strings.ReplaceAll(rt.path, "{id}", sbFuzz)
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		u.RawQuery = query
		r := httptest.NewRequest(rt.method, "/", bytes.NewReader(body))
		r.URL, r.RequestURI = u, ""
		r.Header.Set("X-API-Key", testKey)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		raw := w.Body.Bytes()
		switch st := w.Code; {
		case st >= 500:
			t.Fatalf("%s %s?%s %q: %d %s", rt.method, target, query, body, st, raw)
		case st >= 400:
			checkErrorBody(t, st, raw)
		case rt.method == "POST" && strings.HasSuffix(rt.path, "sandboxes") && st == http.StatusCreated:
			var req newSandbox
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatalf("created from a body that does not decode: %q: %v", body, err)
			}
			fb.mu.Lock()
			cr := fb.lastReq
			fb.mu.Unlock()
			// The engine refuses a TTL that is not positive
			// (engine.wholeSeconds): the front end must first.
			if cr.TTLSeconds == nil || *cr.TTLSeconds <= 0 {
				t.Fatalf("body %q: created with TTL %v", body, cr.TTLSeconds)
			}
			var out sandboxJSON
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("create answer %q: %v", raw, err)
			}
			if out.TemplateID != req.TemplateID || !maps.Equal(out.Metadata, req.Metadata) && len(out.Metadata)+len(req.Metadata) > 0 {
				t.Fatalf("body %q: answered template %q metadata %v", body, out.TemplateID, out.Metadata)
			}
			// The sandbox is gone again: the fake holds only the fixed one.
			fb.mu.Lock()
			for id := range fb.sbs {
				if id != sb.ID {
					delete(fb.sbs, id)
				}
			}
			fb.mu.Unlock()
		}
	})
}

// FuzzMetadataQuery: the list's metadata filter decodes what the SDKs
// encode (each key and value query-escaped, joined by & and =) back to
// the same map, and a filter that decodes re-encodes to one that decodes
// to the same map.
func FuzzMetadataQuery(f *testing.F) {
	f.Add("user=a&run=1")
	f.Add("k%3Dx=v%26y")
	f.Add("a=%zz")
	f.Add("=&=")
	f.Add("noequals")
	f.Fuzz(func(t *testing.T, q string) {
		m, err := parseMetadataQuery(q)
		if err != nil {
			return
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(m[k]))
		}
		again, err := parseMetadataQuery(strings.Join(parts, "&"))
		if err != nil || !maps.Equal(m, again) && len(m) > 0 {
			t.Fatalf("%q decodes to %v, its encoding to %v (%v)", q, m, again, err)
		}
	})
}

// envdBackend is the fake with processes that end at once: a file
// operation's script prints one entry of the path it was given, a command
// exits 0. It records every process request.
type envdBackend struct {
	*fake
	mu   sync.Mutex
	reqs []apitypes.ProcessRequest
}

func (b *envdBackend) OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (Process, error) {
	if _, err := b.get(req.SandboxID); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.reqs = append(b.reqs, req)
	b.mu.Unlock()
	p := &fakeProc{req: req, chunks: make(chan agent.Chunk, 2), exit: make(chan *apitypes.ExecResult, 1)}
	if len(req.Argv) > 4 && req.Argv[0] == "/bin/sh" && req.Argv[3] == "sh" {
		// find's record of the last path argument (Move's destination).
		p.chunks <- agent.Chunk{Stream: "stdout", Data: []byte("f\t1\t644\tuser\tuser\t1700000000.0\t\t" + req.Argv[len(req.Argv)-1] + "\x00")}
	}
	close(p.chunks)
	p.exit <- &apitypes.ExecResult{Termination: apitypes.Termination{Cause: apitypes.CauseExited}}
	return p, nil
}

func (b *envdBackend) ListJobs(ctx context.Context, id string) ([]apitypes.JobInfo, error) {
	return nil, nil
}

// envdProcedures are the RPCs FuzzEnvdRPC calls, with the request message
// each takes (for the round trip) and whether it is server-streaming. The
// watchers are left out: a WatchDir stream lasts until its client leaves.
var envdProcedures = []struct {
	name   string
	msg    func() proto.Message
	stream bool
}{
	{filesystemconnect.FilesystemStatProcedure, func() proto.Message { return &filesystem.StatRequest{} }, false},
	{filesystemconnect.FilesystemMakeDirProcedure, func() proto.Message { return &filesystem.MakeDirRequest{} }, false},
	{filesystemconnect.FilesystemMoveProcedure, func() proto.Message { return &filesystem.MoveRequest{} }, false},
	{filesystemconnect.FilesystemListDirProcedure, func() proto.Message { return &filesystem.ListDirRequest{} }, false},
	{filesystemconnect.FilesystemRemoveProcedure, func() proto.Message { return &filesystem.RemoveRequest{} }, false},
	{processconnect.ProcessStartProcedure, func() proto.Message { return &process.StartRequest{} }, true},
	{processconnect.ProcessConnectProcedure, func() proto.Message { return &process.ConnectRequest{} }, true},
	{processconnect.ProcessListProcedure, func() proto.Message { return &process.ListRequest{} }, false},
	{processconnect.ProcessSendInputProcedure, func() proto.Message { return &process.SendInputRequest{} }, false},
	{processconnect.ProcessSendSignalProcedure, func() proto.Message { return &process.SendSignalRequest{} }, false},
	{processconnect.ProcessCloseStdinProcedure, func() proto.Message { return &process.CloseStdinRequest{} }, false},
	{processconnect.ProcessUpdateProcedure, func() proto.Message { return &process.UpdateRequest{} }, false},
}

// envdCodecs are the encodings a Connect handler takes: Connect's unary
// (bare message) and streaming (enveloped) forms, and gRPC-web's.
var envdCodecs = []struct {
	unary, stream string
	json          bool
}{
	{"application/proto", "application/connect+proto", false},
	{"application/json", "application/connect+json", true},
	{"application/grpc-web+proto", "application/grpc-web+proto", false},
}

// envelope frames msg as Connect's and gRPC-web's streams do: a flags
// byte, a big-endian length, the message.
func envelope(flags byte, msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	out[0] = flags
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

// envdSeeds are real requests, as the E2B SDKs send them.
func envdSeeds() []proto.Message {
	f := false
	cwd := "/tmp"
	return []proto.Message{
		&filesystem.StatRequest{Path: "/home/user/file.txt"},
		&filesystem.MakeDirRequest{Path: "~/a/b"},
		&filesystem.MoveRequest{Source: "x", Destination: "../../../etc/passwd"},
		&filesystem.ListDirRequest{Path: "/", Depth: 65},
		&filesystem.RemoveRequest{Path: "/.."},
		&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"K": "v"}, Cwd: &cwd}, Stdin: &f},
		&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}},
		&process.ListRequest{},
		&process.SendInputRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "t"}}, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}},
		&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1}}, Signal: process.Signal_SIGNAL_SIGTERM},
		&process.CloseStdinRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1}}},
		&process.UpdateRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1}}, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 0, Rows: 5000}}},
	}
}

// connectCodes are the codes a Connect error may carry on the wire.
var connectCodes = map[string]bool{}

func init() {
	for c := connect.Code(1); c <= 16; c++ {
		connectCodes[c.String()] = true
	}
}

// FuzzEnvdRPC: every request to envd's process and filesystem services,
// in each encoding the handler takes, either succeeds or fails with a
// Connect error of a known code that is not internal (the backend never
// fails here); a request message that decodes survives a protobuf and a
// JSON round trip unchanged; every command the services start runs in a
// clean absolute directory, and every path they hand a file script is
// clean and absolute, never the root for Remove, never holding NUL.
func FuzzEnvdRPC(f *testing.F) {
	for i, m := range envdSeeds() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), uint8(0), "", b)
		j, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), uint8(1), "root", j)
	}
	// An envelope claiming more than the read bound.
	f.Add(uint8(5), uint8(0), "", []byte{0, 0xff, 0xff, 0xff, 0xff})
	fb := &envdBackend{fake: newFake()}
	s := New(fb, Options{Keys: []string{testKey}})
	defer s.Close()
	exp := int64(300)
	sb, err := fb.CreateSandbox(context.Background(), apitypes.CreateSandboxRequest{Image: "base", TTLSeconds: &exp,
		Labels: map[string]string{labelTemplate: "base", labelToken: "tok"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, proc, codec uint8, user string, body []byte) {
		pr := envdProcedures[int(proc)%len(envdProcedures)]
		cd := envdCodecs[int(codec)%len(envdCodecs)]
		checkRoundTrip(t, pr.msg, body, cd.json)
		ct, reqBody := cd.unary, body
		if pr.stream || strings.HasPrefix(cd.unary, "application/grpc") {
			ct = cd.stream
			if len(body) == 0 || body[0] != 0 && body[0] != 1 {
				// Framed here unless the input is a frame itself.
				reqBody = envelope(0, body)
			}
		}
		r := httptest.NewRequest("POST", pr.name, bytes.NewReader(reqBody))
		r.Header.Set("Content-Type", ct)
		r.Header.Set("E2b-Sandbox-Id", ToE2B(sb.ID))
		r.Header.Set("X-Access-Token", "tok")
		if strings.HasPrefix(ct, "application/grpc") {
			r.Header.Set("X-Grpc-Web", "1")
		}
		if user != "" {
			r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		}
		fb.mu.Lock()
		fb.reqs = nil
		fb.mu.Unlock()
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		code := rpcErrorCode(t, w, ct)
		// connect-go answers a request whose envelope is malformed (cut
		// short, a compressed flag without compression) with internal
		// "protocol error: ..." before any handler of ours runs: the
		// library's classification, left as it is (docs/security.md).
		libraryFraming := code == "internal" && (bytes.Contains(w.Body.Bytes(), []byte("protocol error")) ||
			strings.Contains(w.Header().Get("Grpc-Message"), "protocol error") ||
			strings.Contains(w.Result().Trailer.Get("Grpc-Message"), "protocol error"))
		if code != "" && !libraryFraming && (!connectCodes[code] || code == "internal" || code == "unknown") {
			t.Fatalf("%s (%s) %q: error code %q: %s", pr.name, ct, body, code, w.Body.Bytes())
		}
		fb.mu.Lock()
		reqs := fb.reqs
		fb.mu.Unlock()
		for _, pq := range reqs {
			checkProcessRequest(t, pr.name, pq)
		}
	})
}

// checkRoundTrip decodes body as the procedure's request; one that decodes
// encodes and decodes again to an equal message, in both encodings.
func checkRoundTrip(t *testing.T, newMsg func() proto.Message, body []byte, isJSON bool) {
	m := newMsg()
	var err error
	if isJSON {
		err = protojson.Unmarshal(body, m)
	} else {
		err = proto.Unmarshal(body, m)
	}
	if err != nil {
		return
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("decoded %T %v does not encode: %v", m, m, err)
	}
	m2 := newMsg()
	if err := proto.Unmarshal(b, m2); err != nil || !proto.Equal(m, m2) {
		t.Fatalf("protobuf round trip of %v: %v, %v", m, m2, err)
	}
	j, err := protojson.Marshal(m)
	if err != nil {
		t.Fatalf("decoded %T %v does not encode as JSON: %v", m, m, err)
	}
	// JSON has no place for fields the schema does not know, which the
	// binary decoding keeps: compare against the message without them.
	want := m
	if !isJSON {
		want = newMsg()
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, want); err != nil {
			t.Fatalf("%T decodes but not without its unknown fields: %v", m, err)
		}
	}
	m3 := newMsg()
	if err := protojson.Unmarshal(j, m3); err != nil || !proto.Equal(want, m3) {
		t.Fatalf("JSON round trip of %v via %s: %v, %v", want, j, m3, err)
	}
}

// rpcErrorCode is the Connect or gRPC error code of an answer, "" for a
// success; a malformed answer fails t.
func rpcErrorCode(t *testing.T, w *httptest.ResponseRecorder, ct string) string {
	t.Helper()
	raw := w.Body.Bytes()
	switch {
	case strings.HasPrefix(ct, "application/grpc"):
		if st := w.Result().Trailer.Get("Grpc-Status"); st != "" && st != "0" {
			return grpcCode(st)
		}
		// gRPC-web sends its status in a trailer frame (flags 0x80).
		for len(raw) >= 5 {
			n := int(binary.BigEndian.Uint32(raw[1:5]))
			if len(raw) < 5+n {
				t.Fatalf("truncated gRPC-web frame: %q", raw)
			}
			if raw[0]&0x80 != 0 {
				for _, line := range strings.Split(string(raw[5:5+n]), "\r\n") {
					if v, ok := strings.CutPrefix(strings.ToLower(line), "grpc-status:"); ok && strings.TrimSpace(v) != "0" {
						return grpcCode(strings.TrimSpace(v))
					}
				}
			}
			raw = raw[5+n:]
		}
		if st := w.Header().Get("Grpc-Status"); st != "" && st != "0" {
			return grpcCode(st)
		}
		return ""
	case strings.HasPrefix(ct, "application/connect+"):
		if w.Code != http.StatusOK {
			return connectBodyCode(t, w.Code, raw)
		}
		// The end-of-stream frame (flags 0x02) carries an error, if any.
		for len(raw) >= 5 {
			n := int(binary.BigEndian.Uint32(raw[1:5]))
			if len(raw) < 5+n {
				t.Fatalf("truncated Connect frame: %q", raw)
			}
			if raw[0]&0x02 != 0 {
				var end struct {
					Error *struct{ Code string } `json:"error"`
				}
				if err := json.Unmarshal(raw[5:5+n], &end); err != nil {
					t.Fatalf("end-of-stream %q: %v", raw[5:5+n], err)
				}
				if end.Error != nil {
					return end.Error.Code
				}
				return ""
			}
			raw = raw[5+n:]
		}
		t.Fatalf("stream without its end: %q", w.Body.Bytes())
	}
	if w.Code == http.StatusOK {
		return ""
	}
	return connectBodyCode(t, w.Code, raw)
}

func connectBodyCode(t *testing.T, status int, raw []byte) string {
	t.Helper()
	var e struct{ Code, Message string }
	if err := json.Unmarshal(raw, &e); err != nil || e.Code == "" {
		t.Fatalf("status %d, body %q is not a Connect error (%v)", status, raw, err)
	}
	return e.Code
}

// grpcCode is the Connect name of a numeric grpc-status.
func grpcCode(st string) string {
	n, err := strconv.Atoi(st)
	if err != nil || n < 1 || n > 16 {
		return "bad grpc-status " + st
	}
	return connect.Code(n).String()
}

// checkProcessRequest: what a service asked of the backend is within the
// bounds the agent and the engine hold requests to.
func checkProcessRequest(t *testing.T, name string, pq apitypes.ProcessRequest) {
	t.Helper()
	if !clean(pq.Cwd) {
		t.Fatalf("%s: command in directory %q", name, pq.Cwd)
	}
	if pq.Rows > 1000 || pq.Cols > 1000 {
		t.Fatalf("%s: terminal %dx%d", name, pq.Cols, pq.Rows)
	}
	for k := range pq.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			t.Fatalf("%s: environment name %q", name, k)
		}
	}
	if len(pq.Argv) > 4 && pq.Argv[0] == "/bin/sh" && pq.Argv[3] == "sh" {
		args := pq.Argv[4:]
		if name == filesystemconnect.FilesystemListDirProcedure {
			args = args[:1]
		}
		for _, p := range args {
			if !clean(p) {
				t.Fatalf("%s: path %q given to the file script", name, p)
			}
			if name == filesystemconnect.FilesystemRemoveProcedure && p == "/" {
				t.Fatalf("%s: removes /", name)
			}
		}
	}
}

// clean: absolute, as path.Clean leaves it, no NUL.
func clean(p string) bool {
	return strings.HasPrefix(p, "/") && path.Clean(p) == p && !strings.ContainsRune(p, 0)
}
