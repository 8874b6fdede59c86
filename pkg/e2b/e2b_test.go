package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process/processconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

const testKey = "e2b_00112233445566778899aabbccddeeff"

// fake is a Backend of sandboxes in memory; its processes print what the
// test tells them and end when told.
type fake struct {
	mu      sync.Mutex
	sbs     map[string]*apitypes.Sandbox
	files   map[string][]byte // sandbox id + path
	procs   []*fakeProc
	kills   []string
	n       int
	lastReq apitypes.CreateSandboxRequest
	tmpls   []apitypes.Template // the daemon's templates
}

func newFake() *fake { return &fake{sbs: map[string]*apitypes.Sandbox{}, files: map[string][]byte{}} }

func (f *fake) CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Template == "" && req.Image != "base" && req.Image != "shell" {
		return nil, errdefs.Invalidf("image: unknown image %q (known: base)", req.Image)
	}
	f.n++
	f.lastReq = req
	now := time.Now()
	exp := now.Add(time.Duration(*req.TTLSeconds) * time.Second)
	sb := &apitypes.Sandbox{ID: fmt.Sprintf("sb-%012x", f.n), State: apitypes.StateReady, Image: req.Image, Labels: req.Labels,
		Limits: apitypes.Limits{MemoryBytes: 512 << 20, CPUs: 1, DiskBytes: 1 << 30}, CreatedAt: now, ExpiresAt: &exp}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fake) get(id string) (*apitypes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	c := *sb
	return &c, nil
}

func (f *fake) GetSandbox(ctx context.Context, id string) (*apitypes.SandboxDetail, error) {
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	return &apitypes.SandboxDetail{Sandbox: *sb, Usage: &apitypes.Usage{MemoryBytes: 1 << 20, CPUSeconds: 0.5}}, nil
}

func (f *fake) ListSandboxes(ctx context.Context, state string) ([]*apitypes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*apitypes.Sandbox
	for _, sb := range f.sbs {
		c := *sb
		out = append(out, &c)
	}
	return out, nil
}

func (f *fake) setState(id string, st apitypes.State) (*apitypes.Sandbox, error) {
	f.mu.Lock()
	sb, ok := f.sbs[id]
	if ok {
		sb.State = st
	}
	f.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	return f.get(id)
}

func (f *fake) TerminateSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	return f.setState(id, apitypes.StateTerminated)
}
func (f *fake) PauseSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	return f.setState(id, apitypes.StatePaused)
}
func (f *fake) ResumeSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	return f.setState(id, apitypes.StateReady)
}

func (f *fake) SetSandboxTimeout(ctx context.Context, id string, seconds int64) (*apitypes.Sandbox, error) {
	f.mu.Lock()
	if sb, ok := f.sbs[id]; ok {
		exp := time.Now().Add(time.Duration(seconds) * time.Second)
		sb.ExpiresAt = &exp
	}
	f.mu.Unlock()
	return f.get(id)
}

func (f *fake) ImageList(ctx context.Context) (*apitypes.ImageList, error) {
	return &apitypes.ImageList{Images: []apitypes.Image{{Name: "base", Digest: "d1"}}, Unbuilt: []apitypes.ImageRecipe{{Name: "python", Language: true}}}, nil
}

func (f *fake) ListTemplates(ctx context.Context) (*apitypes.TemplateList, error) {
	return &apitypes.TemplateList{Templates: append([]apitypes.Template{}, f.tmpls...)}, nil
}

func (f *fake) Exec(ctx context.Context, req apitypes.ExecRequest) (*apitypes.ExecResult, error) {
	return nil, errdefs.New(errdefs.Internal, "not used")
}

type fakeProc struct {
	req    apitypes.ProcessRequest
	chunks chan agent.Chunk
	stdin  bytes.Buffer
	closed bool
	rows   uint16
	exit   chan *apitypes.ExecResult
	mu     sync.Mutex
}

func (p *fakeProc) JobID() string              { return "j-1" }
func (p *fakeProc) Chunks() <-chan agent.Chunk { return p.chunks }
func (p *fakeProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdin.Write(b)
}
func (p *fakeProc) CloseStdin() error                   { p.mu.Lock(); defer p.mu.Unlock(); p.closed = true; return nil }
func (p *fakeProc) Resize(rows, cols uint16) error      { p.rows = rows; return nil }
func (p *fakeProc) Wait() (*apitypes.ExecResult, error) { return <-p.exit, nil }
func (p *fakeProc) Close() error                        { return nil }

// finish prints out and ends the process with code.
func (p *fakeProc) finish(out string, code int) {
	p.chunks <- agent.Chunk{Stream: "stdout", Data: []byte(out)}
	p.chunks <- agent.Chunk{Stream: "stderr", Data: []byte("err")}
	close(p.chunks)
	p.exit <- &apitypes.ExecResult{ExitCode: code, Termination: apitypes.Termination{Cause: apitypes.CauseExited}}
}

func (f *fake) OpenProcess(ctx context.Context, req apitypes.ProcessRequest) (Process, error) {
	if _, err := f.get(req.SandboxID); err != nil {
		return nil, err
	}
	p := &fakeProc{req: req, chunks: make(chan agent.Chunk, 8), exit: make(chan *apitypes.ExecResult, 1)}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	if strings.Contains(strings.Join(req.Argv, " "), "mkdir -p /home/user") {
		go p.finish("", 0) // makeHome's script
	}
	return p, nil
}

func (f *fake) AttachProcess(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64) (Process, error) {
	return nil, errdefs.NotFoundf("job %s: not found", jobID)
}

func (f *fake) KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	f.mu.Lock()
	f.kills = append(f.kills, req.JobID+":"+req.Signal)
	p := f.procs[len(f.procs)-1]
	f.mu.Unlock()
	close(p.chunks)
	p.exit <- &apitypes.ExecResult{ExitCode: 137, Termination: apitypes.Termination{Cause: apitypes.CauseSignal, Signal: req.Signal}}
	return &apitypes.JobKillResult{JobID: req.JobID, Signal: req.Signal, State: "finished"}, nil
}

func (f *fake) ListJobs(ctx context.Context, id string) ([]apitypes.JobInfo, error) {
	return []apitypes.JobInfo{{ID: "j-1", PID: 42}}, nil
}

func (f *fake) WriteFileFrom(ctx context.Context, id, p, mode string, appendTo bool, size int64, r io.Reader) (*apitypes.FileResult, error) {
	data, _ := io.ReadAll(r)
	if int64(len(data)) != size {
		return nil, errdefs.Invalidf("size mismatch")
	}
	if strings.HasPrefix(p, "/home/user/file.txt/") {
		return nil, errdefs.Invalidf("path: %s: not a directory", p)
	}
	f.mu.Lock()
	f.files[id+p] = data
	f.mu.Unlock()
	return &apitypes.FileResult{Path: p, Size: size}, nil
}

func (f *fake) ReadFileRaw(ctx context.Context, req apitypes.FileReadRequest) (*agent.FileData, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, ok := f.files[req.SandboxID+req.Path]
	if !ok {
		return nil, errdefs.NotFoundf("path: %s: no such file", req.Path)
	}
	return &agent.FileData{Path: req.Path, Data: data, Size: int64(len(data))}, nil
}

func (f *fake) DeleteFile(ctx context.Context, id, p string, recursive bool) (*apitypes.FileResult, error) {
	return &apitypes.FileResult{Path: p}, nil
}

func (f *fake) ExposePort(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error) {
	return &apitypes.PortExposure{}, nil
}

func (f *fake) DialExposed(ctx context.Context, id string, port int) (net.Conn, error) {
	return nil, errdefs.Unavailablef("nothing listens on port %d", port)
}

func newServer(t *testing.T) (*fake, *httptest.Server) {
	f := newFake()
	s := New(f, Options{Keys: []string{testKey}, Domain: "e2b.test"})
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return f, ts
}

func call(t *testing.T, ts *httptest.Server, method, path, body string, hdr map[string]string) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", testKey)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	} else if len(raw) > 0 && raw[0] == '[' {
		var l []any
		_ = json.Unmarshal(raw, &l)
		m = map[string]any{"list": l}
	}
	return res.StatusCode, m, res.Header
}

func TestIDs(t *testing.T) {
	if got := ToE2B("sb-0123456789ab"); got != "sb0123456789ab" {
		t.Errorf("ToE2B: %q", got)
	}
	for in, want := range map[string]string{"sb0123456789ab": "sb-0123456789ab", "sb0123456789ab-6532622b": "sb-0123456789ab"} {
		if got, ok := FromE2B(in); !ok || got != want {
			t.Errorf("FromE2B(%q) = %q, %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "sb", "sb-01", "SB01", "sb01/..", "xx0123", "sb01\x00"} {
		if _, ok := FromE2B(bad); ok {
			t.Errorf("FromE2B(%q) accepted", bad)
		}
	}
}

// TestTemplateID: E2B's templateID names one of the daemon's templates
// (template_create) before an image: the create asks the engine for that
// template, and GET /templates lists it beside the images.
func TestTemplateID(t *testing.T) {
	f, ts := newServer(t)
	mem := int64(256)
	f.tmpls = []apitypes.Template{{TemplateCreateRequest: apitypes.TemplateCreateRequest{Name: "web", Image: "base", MemoryMB: &mem}}}
	st, m, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"web"}`, nil)
	if st != 201 || m["templateID"] != "web" {
		t.Fatalf("create from template web: %d %v", st, m)
	}
	if f.lastReq.Template != "web" || f.lastReq.Image != "" || !f.lastReq.Root {
		t.Errorf("create request: template %q image %q root %v", f.lastReq.Template, f.lastReq.Image, f.lastReq.Root)
	}
	st, m, _ = call(t, ts, "POST", "/sandboxes", `{"templateID":"base"}`, nil)
	if st != 201 || f.lastReq.Template != "" || f.lastReq.Image != "base" {
		t.Errorf("create from image base: %d %v, request %+v", st, m, f.lastReq)
	}
	st, m, _ = call(t, ts, "GET", "/templates", "", nil)
	if l, _ := m["list"].([]any); st != 200 || len(l) != 3 || l[0].(map[string]any)["templateID"] != "web" || l[0].(map[string]any)["memoryMB"] != float64(256) {
		t.Errorf("GET /templates: %d %v", st, m)
	}
}

func TestControlPlane(t *testing.T) {
	f, ts := newServer(t)
	// Authentication: missing and wrong keys are 401 with E2B's body.
	for _, key := range []string{"", "e2b_ffff"} {
		req, _ := http.NewRequest("GET", ts.URL+"/v2/sandboxes", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body errorBody
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != 401 || body.Code != 401 || body.Message == "" {
			t.Errorf("key %q: %d %+v", key, res.StatusCode, body)
		}
	}
	st, m, _ := call(t, ts, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"k":"v 1"},"envVars":{"A":"b"},"allow_internet_access":false,"mcp":{"x":1}}`, nil)
	if st != 201 || m["clientID"] != clientID || m["envdVersion"] != EnvdVersion || m["templateID"] != "base" || m["envdAccessToken"] == nil || m["domain"] != "e2b.test" {
		t.Fatalf("create: %d %v", st, m)
	}
	id := m["sandboxID"].(string)
	if id != "sb000000000001" || f.lastReq.Network != "none" || f.lastReq.Env["A"] != "b" || !f.lastReq.Root || !f.lastReq.RootAsUser || *f.lastReq.TTLSeconds != 60 {
		t.Errorf("create: id %q, request %+v", id, f.lastReq)
	}
	st, m, _ = call(t, ts, "GET", "/sandboxes/"+id, "", nil)
	for _, k := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion"} {
		if _, ok := m[k]; !ok {
			t.Errorf("get: %d, no %s in %v", st, k, m)
		}
	}
	if m["state"] != "running" || m["metadata"].(map[string]any)["k"] != "v 1" {
		t.Errorf("get: %v", m)
	}
	// List with a metadata filter (encoded twice, as the SDKs do) and paging.
	call(t, ts, "POST", "/sandboxes", `{"templateID":"base","metadata":{"k":"other"}}`, nil)
	st, m, hdr := call(t, ts, "GET", "/v2/sandboxes?metadata="+url.QueryEscape("k="+url.QueryEscape("v 1")), "", nil)
	if l := m["list"].([]any); st != 200 || len(l) != 1 || l[0].(map[string]any)["sandboxID"] != id || hdr.Get("X-Next-Token") != "" {
		t.Errorf("list by metadata: %d %v", st, m)
	}
	_, m, hdr = call(t, ts, "GET", "/v2/sandboxes?limit=1", "", nil)
	if l := m["list"].([]any); len(l) != 1 || hdr.Get("X-Next-Token") != id {
		t.Errorf("page 1: %v, token %q", m, hdr.Get("X-Next-Token"))
	}
	_, m, hdr = call(t, ts, "GET", "/v2/sandboxes?limit=1&nextToken="+id, "", nil)
	if l := m["list"].([]any); len(l) != 1 || l[0].(map[string]any)["sandboxID"] == id || hdr.Get("X-Next-Token") != "" {
		t.Errorf("page 2: %v", m)
	}
	for _, q := range []string{"limit=0", "limit=101", "state=dead", "metadata=novalue"} {
		if st, m, _ := call(t, ts, "GET", "/v2/sandboxes?"+q, "", nil); st != 400 || m["code"] != float64(400) {
			t.Errorf("list ?%s: %d %v", q, st, m)
		}
	}
	// Timeout, pause (twice: 409), connect (201 resumed, then 200).
	if st, _, _ := call(t, ts, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":600}`, nil); st != 204 {
		t.Errorf("timeout: %d", st)
	}
	for _, body := range []string{`{}`, `{"timeout":-1}`, `nope`} {
		if st, _, _ := call(t, ts, "POST", "/sandboxes/"+id+"/timeout", body, nil); st != 400 {
			t.Errorf("timeout %s: %d", body, st)
		}
	}
	if st, _, _ := call(t, ts, "POST", "/sandboxes/"+id+"/pause", `{}`, nil); st != 204 {
		t.Errorf("pause: %d", st)
	}
	if st, m, _ := call(t, ts, "POST", "/sandboxes/"+id+"/pause", `{}`, nil); st != 409 || m["code"] != float64(409) {
		t.Errorf("pause again: %d %v", st, m)
	}
	if st, m, _ := call(t, ts, "POST", "/sandboxes/"+id+"/connect", `{"timeout":30}`, nil); st != 201 || m["sandboxID"] != id {
		t.Errorf("connect paused: %d %v", st, m)
	}
	if st, _, _ := call(t, ts, "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":30}`, nil); st != 200 {
		t.Errorf("connect running: %d", st)
	}
	st, m, _ = call(t, ts, "GET", "/sandboxes/"+id+"/metrics", "", nil)
	if l := m["list"].([]any); st != 200 || len(l) != 1 || l[0].(map[string]any)["timestampUnix"] == nil || l[0].(map[string]any)["timestamp"] == nil {
		t.Errorf("metrics: %d %v", st, m)
	}
	if st, m, _ := call(t, ts, "GET", "/templates", "", nil); st != 200 || len(m["list"].([]any)) != 2 {
		t.Errorf("templates: %d %v", st, m)
	}
	// Kill, then everything about it is 404 with E2B's body.
	if st, _, _ := call(t, ts, "DELETE", "/sandboxes/"+id, "", nil); st != 204 {
		t.Errorf("kill: %d", st)
	}
	for _, p := range []string{"DELETE /sandboxes/" + id, "GET /sandboxes/" + id, "POST /sandboxes/" + id + "/connect", "GET /sandboxes/sb-01", "GET /sandboxes/..%2f"} {
		mp := strings.SplitN(p, " ", 2)
		if st, m, _ := call(t, ts, mp[0], mp[1], `{"timeout":1}`, nil); st != 404 || m["code"] != float64(404) {
			t.Errorf("%s: %d %v", p, st, m)
		}
	}
	// autoPause: paused, not killed, when the timeout passes.
	if st, _, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"base","autoPause":true,"timeout":5}`, nil); st != 201 || !f.lastReq.PauseOnExpiry {
		t.Errorf("autoPause: %d %+v", st, f.lastReq)
	}
	// Another image as a template gets E2B's home, made as root.
	f.procs = nil
	if st, m, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"shell"}`, nil); st != 201 || m["templateID"] != "shell" || len(f.procs) != 1 || !f.procs[0].req.Root {
		t.Errorf("create from shell: %d %v, processes %v", st, m, f.procs)
	}
	// Bad creates.
	for body, want := range map[string]int{`{"templateID":"nope"}`: 404, `{"templateID":"ns/x:tag"}`: 404, `{}`: 400, `[`: 400} {
		if st, m, _ := call(t, ts, "POST", "/sandboxes", body, nil); st != want || m["code"] != float64(want) {
			t.Errorf("create %s: %d %v", body, st, m)
		}
	}
}

func TestRoutingAndFiles(t *testing.T) {
	f, ts := newServer(t)
	_, m, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"base"}`, nil)
	id, tok := m["sandboxID"].(string), m["envdAccessToken"].(string)
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": tok}

	// /health: 204 for a live sandbox, 502 (E2B's proxy) for others.
	if st, _, _ := call(t, ts, "GET", "/health", "", envd); st != 204 {
		t.Errorf("health: %d", st)
	}
	if st, m, _ := call(t, ts, "GET", "/health", "", map[string]string{"E2b-Sandbox-Id": "sb0000000000ff"}); st != 502 || m["code"] != float64(502) {
		t.Errorf("health of unknown: %d %v", st, m)
	}
	// Host-name routing reaches the same sandbox.
	req, _ := http.NewRequest("GET", ts.URL+"/health", nil)
	req.Host = "49983-" + id + ".e2b.test"
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 204 {
		t.Errorf("host routing: %v %v", res, err)
	}

	// Multipart upload with full paths in the file names (writeFiles).
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, data := range map[string]string{"/home/user/dir/a.txt": "A", "b.txt": "BB"} {
		w, _ := mw.CreateFormFile("file", name)
		_, _ = w.Write([]byte(data))
	}
	mw.Close()
	hdr := map[string]string{"Content-Type": mw.FormDataContentType()}
	for k, v := range envd {
		hdr[k] = v
	}
	st, m, _ := call(t, ts, "POST", "/files", buf.String(), hdr)
	if st != 200 || len(m["list"].([]any)) != 2 || string(f.files["sb-000000000001/home/user/dir/a.txt"]) != "A" || string(f.files["sb-000000000001/home/user/b.txt"]) != "BB" {
		t.Errorf("multipart: %d %v %v", st, m, f.files)
	}
	// Octet-stream, gzip-encoded.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("zipped"))
	zw.Close()
	hdr = map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
	for k, v := range envd {
		hdr[k] = v
	}
	if st, _, _ := call(t, ts, "POST", "/files?path=~/z.txt", gz.String(), hdr); st != 200 || string(f.files["sb-000000000001/home/user/z.txt"]) != "zipped" {
		t.Errorf("octet-stream gzip: %d", st)
	}
	// Without the token a secure sandbox refuses; a write under a file is
	// the engine's error as JSON.
	if st, _, _ := call(t, ts, "POST", "/files?path=x", "x", map[string]string{"E2b-Sandbox-Id": id, "Content-Type": "application/octet-stream"}); st != 401 {
		t.Errorf("upload without token: %d", st)
	}
	if st, m, _ := call(t, ts, "POST", "/files?path=/home/user/file.txt/x", "x", hdr); st != 400 || m["code"] != float64(400) {
		t.Errorf("write under a file: %d %v", st, m)
	}
	if st, _, _ := call(t, ts, "GET", "/files?path=/home/user/nope", "", envd); st != 404 {
		t.Errorf("missing file: %d", st)
	}
	if st, _, _ := call(t, ts, "GET", "/files?path=x&username=mallory", "", envd); st != 401 {
		t.Errorf("unknown user: %d", st)
	}

	// A signed URL carries no routing headers: its signature routes it.
	sig := signature("/home/user/b.txt", "read", "", tok, "")
	res, err := http.Get(ts.URL + "/files?path=/home/user/b.txt&signature=" + url.QueryEscape(sig))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "BB" {
		t.Errorf("signed download: %d %q", res.StatusCode, body)
	}
	exp := fmt.Sprint(time.Now().Add(-time.Minute).Unix())
	old := signature("/home/user/b.txt", "read", "", tok, exp)
	res, err = http.Get(ts.URL + "/files?path=/home/user/b.txt&signature=" + url.QueryEscape(old) + "&signature_expiration=" + exp)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 { // no sandbox matches: the control plane wants a key
		t.Errorf("expired signature: %d", res.StatusCode)
	}
	forged := signature("/home/user/b.txt", "read", "", "guess", "")
	if st, _, _ := call(t, ts, "GET", "/files?path=/home/user/b.txt&signature="+url.QueryEscape(forged), "", map[string]string{"E2b-Sandbox-Id": id}); st != 401 {
		t.Errorf("forged signature: %d", st)
	}
	// RPCs need the token, and a known user.
	if st, _, _ := call(t, ts, "POST", "/process.Process/List", "{}", map[string]string{"E2b-Sandbox-Id": id, "Content-Type": "application/json"}); st != 401 {
		t.Errorf("RPC without token: %d", st)
	}
	bad := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("mallory:")), "Content-Type": "application/json"}
	for k, v := range envd {
		bad[k] = v
	}
	if st, _, _ := call(t, ts, "POST", "/process.Process/List", "{}", bad); st != 401 {
		t.Errorf("RPC as an unknown user: %d", st)
	}
	// A user port without a listener is E2B's 502.
	if st, m, _ := call(t, ts, "GET", "/", "", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "3000"}); st != 502 || m["code"] != float64(502) {
		t.Errorf("closed port: %d %v", st, m)
	}
}

// authed adds the routing headers and token to every RPC.
type authed struct {
	id, tok, user string
}

func (a authed) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		a.set(req.Header())
		return next(ctx, req)
	}
}
func (a authed) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		a.set(conn.RequestHeader())
		return conn
	}
}
func (a authed) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
func (a authed) set(h http.Header) {
	h.Set("E2b-Sandbox-Id", a.id)
	h.Set("X-Access-Token", a.tok)
	if a.user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(a.user+":")))
	}
}

func TestProcess(t *testing.T) {
	f, ts := newServer(t)
	_, m, _ := call(t, ts, "POST", "/sandboxes", `{"templateID":"base"}`, nil)
	id, tok := m["sandboxID"].(string), m["envdAccessToken"].(string)
	cl := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON(), connect.WithInterceptors(authed{id, tok, "root"}))
	ctx := context.Background()
	f32 := false
	stream, err := cl.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"K": "v"}}, Stdin: &f32}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetEvent().GetStart().GetPid() != 42 {
		t.Fatalf("first event: %v %v", stream.Msg(), stream.Err())
	}
	f.mu.Lock()
	p := f.procs[0]
	f.mu.Unlock()
	if !p.req.Root || p.req.TimeoutSeconds != 0 || p.req.Cwd != "/root" || p.req.Env["K"] != "v" || p.req.Env["HOME"] != "/root" || p.req.Env["E2B_SANDBOX_ID"] != id || !p.closed || p.req.TTY {
		t.Errorf("process request: %+v closed stdin %v", p.req, p.closed)
	}
	// Listed while it runs, then its output and end.
	list, err := cl.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != 42 {
		t.Errorf("list: %v %v", list, err)
	}
	go p.finish("out", 3)
	var stdout, stderr string
	var end *process.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		stdout += string(ev.GetData().GetStdout())
		stderr += string(ev.GetData().GetStderr())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if stream.Err() != nil || stdout != "out" || stderr != "err" || end == nil || end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" {
		t.Errorf("stream: %q %q %v %v", stdout, stderr, end, stream.Err())
	}
	// A late Connect still gets the end; input to an ended process is not_found.
	cs, err := cl.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for cs.Receive() {
		n++
	}
	if n != 2 {
		t.Errorf("late connect: %d events, %v", n, cs.Err())
	}
	_, err = cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("input to an ended process: %v", err)
	}
	_, err = cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal to an unknown process: %v", err)
	}

	// A PTY: input, resize, kill ends it with a signal.
	ucl := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON(), connect.WithInterceptors(authed{id, tok, ""}))
	// The request's deadline (Connect-Timeout-Ms) becomes the command's
	// timeout, enforced by the agent whether the client stays or not.
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err = ucl.Start(tctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Cwd: ptr("sub")}, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}))
	if err != nil || !stream.Receive() {
		t.Fatal(err, stream.Err())
	}
	f.mu.Lock()
	p = f.procs[1]
	f.mu.Unlock()
	if p.req.Root || !p.req.TTY || p.req.Rows != 24 || p.req.Cwd != "/home/user/sub" || p.req.Env["USER"] != "user" || p.req.TimeoutSeconds < 29 || p.req.TimeoutSeconds > 30 {
		t.Errorf("pty request: %+v", p.req)
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}
	if _, err := ucl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("ls\n")}}})); err != nil || p.stdin.String() != "ls\n" {
		t.Errorf("pty input: %v %q", err, p.stdin.String())
	}
	huge := bytes.Repeat([]byte("x"), maxRPCBytes)
	if _, err := ucl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: huge}}})); connect.CodeOf(err) != connect.CodeResourceExhausted || p.stdin.Len() != 3 {
		t.Errorf("oversized input: %v, %d bytes reached the process", err, p.stdin.Len())
	}
	if _, err := ucl.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}}})); err != nil || p.rows != 30 {
		t.Errorf("resize: %v %d", err, p.rows)
	}
	if _, err := ucl.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 0, Rows: 30}}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("resize to 0 columns: %v", err)
	}
	if _, err := ucl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" || f.kills[0] != "j-1:SIGKILL" {
		t.Errorf("killed end: %v, kills %v", end, f.kills)
	}
	// Bad input.
	_, err = ucl.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{}}))
	if err == nil {
		s, _ := ucl.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{}}))
		s.Receive()
		err = s.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("start without cmd: %v", err)
	}
	var ce *connect.Error
	if _, err := ucl.StreamInput(ctx).CloseAndReceive(); !errors.As(err, &ce) || ce.Code() != connect.CodeUnimplemented {
		t.Errorf("StreamInput: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestDiffAndEntries(t *testing.T) {
	old := parseSnapshot([]byte("f 1.0 3 a\x00d 1.0 4096 dir\x00f 1.0 1 gone\x00"))
	cur := parseSnapshot([]byte("f 2.0 5 a\x00d 2.0 4096 dir\x00f 2.0 0 empty\x00f 2.0 3 new\x00"))
	var got []string
	for _, ev := range diff(old, cur) {
		got = append(got, ev.GetType().String()+":"+ev.GetName())
	}
	want := "EVENT_TYPE_WRITE:a EVENT_TYPE_CREATE:empty EVENT_TYPE_CREATE:new EVENT_TYPE_WRITE:new EVENT_TYPE_REMOVE:gone"
	if strings.Join(got, " ") != want {
		t.Errorf("diff: %v", got)
	}
	es, err := parseEntries([]byte("d\t4096\t755\tuser\tuser\t1700000000.5\t\t/home/user/d\x00l\t3\t777\troot\troot\t1700000000\t/etc\t/home/user/l\x00f\t10\t644\tuser\tuser\t1700000000\t\t/home/user/a b\tc\x00"))
	if err != nil || len(es) != 3 {
		t.Fatal(err, es)
	}
	if es[0].GetPermissions() != "drwxr-xr-x" || es[0].GetName() != "d" || es[1].GetSymlinkTarget() != "/etc" || es[2].GetName() != "a b\tc" || es[2].GetSize() != 10 || es[2].GetPermissions() != "-rw-r--r--" {
		t.Errorf("entries: %v", es)
	}
	if _, err := parseEntries([]byte("garbage\x00")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestResolveAndUsers(t *testing.T) {
	for in, want := range map[string]string{"~": "/home/user", "~/x": "/home/user/x", "x/../y": "/home/user/y", "/a/../../b": "/b"} {
		if got, err := resolve("user", in); err != nil || got != want {
			t.Errorf("resolve(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "a\x00b"} {
		if _, err := resolve("user", bad); err == nil {
			t.Errorf("resolve(%q) accepted", bad)
		}
	}
	if got, _ := resolve("root", "x"); got != "/root/x" {
		t.Errorf("root's relative path: %q", got)
	}
	for _, bad := range []string{"mallory", "root2", "user "} {
		if _, err := checkUser(bad); errdefs.CodeOf(err) != errdefs.Unauthenticated {
			t.Errorf("user %q: %v", bad, err)
		}
	}
}

func TestReadKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := ReadKeys(write("ok", "# comment\n\n  "+testKey+"  \ne2b_0123456789abcdef0123\n"))
	if err != nil || len(keys) != 2 || keys[0] != testKey {
		t.Errorf("keys: %v %v", keys, err)
	}
	for name, text := range map[string]string{"empty": "# none\n", "upper": "e2b_0123456789ABCDEF\n", "short": "e2b_0123\n", "prefix": "sk_0123456789abcdef01\n", "space": "e2b_0123456789abcdef 01\n"} {
		if _, err := ReadKeys(write(name, text)); err == nil {
			t.Errorf("%s key file accepted", name)
		}
	}
	if _, err := ReadKeys(dir + "/missing"); err == nil {
		t.Error("missing key file accepted")
	}
}
