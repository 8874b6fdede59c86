// Package client is the Go client of the mcp-sandboxd REST API, over the
// daemon's unix socket or over HTTP with a bearer token. It is what sandboxctl
// and the MCP stdio proxy use, and it links no cgo: the daemon's engine types
// are mirrored here as plain JSON types (types.go).
//
// Failed requests return *errdefs.Error carrying the daemon's error code, so
// callers map them with errdefs.ExitCode and friends; a daemon that cannot be
// reached at all yields an error matching ErrUnreachable.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs/errhttp"
)

// DefaultSocket is the daemon's default API socket (server.socket).
const DefaultSocket = "/run/mcp-sandboxd/api.sock"

// ErrUnreachable matches (errors.Is) every error caused by failing to connect
// to the daemon: no socket, connection refused, unknown host.
var ErrUnreachable = errors.New("daemon unreachable")

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// Options say how to reach the daemon. Exactly one of Socket and URL is used;
// URL wins when both are set.
type Options struct {
	// Socket is the path of the daemon's unix socket (no authentication).
	Socket string
	// URL is the daemon's HTTP address, e.g. http://127.0.0.1:7070.
	URL string
	// Token is the bearer token for URL.
	Token string
	// Transport, if not nil, carries the requests to URL (the gateway's:
	// pooled connections to its nodes and its own credentials on every
	// request, pkg/gateway).
	Transport http.RoundTripper
}

// Client talks to one daemon. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	http  *http.Client
	token string
}

// New returns a client for the daemon opt describes (DefaultSocket when
// opt is empty).
func New(opt Options) (*Client, error) {
	if opt.URL != "" {
		u, err := url.Parse(opt.URL)
		if err != nil {
			return nil, errdefs.Invalidf("url: %v", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return nil, errdefs.Invalidf("url: want http://HOST:PORT or https://HOST:PORT, got %q", opt.URL)
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		return &Client{base: u, http: &http.Client{Transport: opt.Transport}, token: opt.Token}, nil
	}
	sock := opt.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}
	// The host part is never resolved: every connection goes to the socket.
	return &Client{base: &url.URL{Scheme: "http", Host: "sandboxd"}, http: &http.Client{Transport: tr}, token: opt.Token}, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	return u.String()
}

// do sends a request and returns the response when its status is 2xx (or
// one of okStatus); any other status is decoded into an *errdefs.Error.
func (c *Client) do(req *http.Request, okStatus ...int) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	for _, s := range okStatus {
		if resp.StatusCode == s {
			return resp, nil
		}
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// transportError marks failures to connect as ErrUnreachable; anything that
// happened on an established connection stays as it is.
func transportError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

// decodeError turns an error response into an *errdefs.Error, falling back
// on the status when the body is not the API's error object (a proxy's page).
func decodeError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var er ErrorResponse
	if json.Unmarshal(body, &er) == nil && er.Error.Code != "" {
		return er.Error.Err()
	}
	msg := strings.TrimSpace(string(body))
	if msg == "" {
		msg = resp.Status
	}
	return &errdefs.Error{Code: codeOfStatus(resp.StatusCode), Message: msg}
}

// postStream posts body to path and reads the NDJSON answer (pkg/api's
// ndjsonStream), one line into a fresh L at a time, until each says the
// line ends the stream (with its result or the error it carries). The
// stream ending before such a line is an error naming what was read.
func postStream[L, R any](ctx context.Context, c *Client, path string, q url.Values, body any, what string, each func(*L) (done bool, res *R, err error)) (*R, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.send(ctx, http.MethodPost, path, q, body)
	if err != nil {
		return nil, err
	}
	defer finish(resp.Body, cancel)
	dec := json.NewDecoder(resp.Body)
	for {
		var line L
		if err := dec.Decode(&line); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("read %s stream: %w", what, err)
		}
		if done, res, err := each(&line); done || err != nil {
			return res, err
		}
	}
}

// codeOfStatus reads the daemon's one code → status table
// (pkg/errdefs/errhttp) backwards, for answers that carry only a status.
func codeOfStatus(status int) errdefs.Code { return errhttp.CodeOf(status) }

// doJSON sends in (if not nil) as JSON and decodes the response into out (if
// not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any, okStatus ...int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.send(ctx, method, path, q, in, okStatus...)
	if err != nil {
		return err
	}
	defer finish(resp.Body, cancel)
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

// Bounds of finish's read of what is left of an answer.
const (
	maxDrainBytes = 64 << 10
	drainWait     = 50 * time.Millisecond
)

// finish reads what is left of an answer's body after its last line or
// object, then closes it. A body closed before its end (a chunked
// answer's last chunk, the newline after the JSON) takes its connection
// with it, and the next request dials a new one: after an exec stream,
// every other call did (BenchmarkRESTLifecycle's terminate, traced). The
// read is bounded in bytes and in time — cancel, the request's, aborts it
// after drainWait — so a server that holds the answer open costs a new
// connection, never a hang.
func finish(body io.ReadCloser, cancel context.CancelFunc) {
	t := time.AfterFunc(drainWait, cancel)
	_, _ = io.CopyN(io.Discard, body, maxDrainBytes)
	t.Stop()
	_ = body.Close()
}

// send sends in (if not nil) as JSON and returns the response of an
// accepted status; the caller closes its body.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, in any, okStatus ...int) (*http.Response, error) {
	var body io.Reader
	raw, isRaw := in.(io.Reader) // an upload, sent as it is
	if isRaw {
		body = raw
	} else if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	switch {
	case isRaw:
		req.Header.Set("Content-Type", "application/octet-stream")
	case in != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	return c.do(req, okStatus...)
}

func sandboxPath(id string, rest string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + rest
}

// Health asks whether the daemon serves (GET /healthz).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	return &h, c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, &h)
}

// Readiness runs the daemon's readiness checks (GET /readyz). A daemon that
// is not ready is not an error: look at Readiness.Status.
func (c *Client) Readiness(ctx context.Context) (*Readiness, error) {
	var r Readiness
	return &r, c.doJSON(ctx, http.MethodGet, "/readyz", nil, nil, &r, http.StatusServiceUnavailable)
}

// Status summarises the daemon (GET /v1/status).
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.doJSON(ctx, http.MethodGet, "/v1/status", nil, nil, &s)
}

// CreateSandbox starts a sandbox and returns it once it is ready.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	var s Sandbox
	return &s, c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &s)
}

// ListSandboxes lists sandboxes in state: "" for the live ones, "all" for
// every state.
func (c *Client) ListSandboxes(ctx context.Context, state string) ([]Sandbox, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	var l struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return l.Sandboxes, c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &l)
}

// GetSandbox describes a sandbox and its usage.
func (c *Client) GetSandbox(ctx context.Context, id string) (*SandboxDetail, error) {
	var d SandboxDetail
	return &d, c.doJSON(ctx, http.MethodGet, sandboxPath(id, ""), nil, nil, &d)
}

// TerminateSandbox stops a sandbox and removes every trace of it.
func (c *Client) TerminateSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var s Sandbox
	return &s, c.doJSON(ctx, http.MethodDelete, sandboxPath(id, ""), nil, nil, &s)
}

// SandboxNetwork changes a sandbox's network mode and allowlist; with
// neither set it reports them. Either way the answer has the counters.
func (c *Client) SandboxNetwork(ctx context.Context, req SandboxNetworkRequest) (*NetworkStatus, error) {
	var st NetworkStatus
	if req.Mode == "" && req.Allow == nil {
		return &st, c.doJSON(ctx, http.MethodGet, sandboxPath(req.SandboxID, "/network"), nil, nil, &st)
	}
	return &st, c.doJSON(ctx, http.MethodPut, sandboxPath(req.SandboxID, "/network"), nil, req, &st)
}

// PauseSandbox freezes a sandbox's processes.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var s Sandbox
	return &s, c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/pause"), nil, nil, &s)
}

// ResumeSandbox thaws a paused sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var s Sandbox
	return &s, c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/resume"), nil, nil, &s)
}

// Images lists the built language images.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var l struct {
		Images []Image `json:"images"`
	}
	return l.Images, c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &l)
}

// ImageList lists the built images and the recipes not built yet
// (GET /v1/images).
func (c *Client) ImageList(ctx context.Context) (*apitypes.ImageList, error) {
	var l apitypes.ImageList
	return &l, c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &l)
}

// GC removes leftovers that belong to no live sandbox.
func (c *Client) GC(ctx context.Context) (*GCReport, error) {
	var r GCReport
	return &r, c.doJSON(ctx, http.MethodPost, "/v1/gc", nil, nil, &r)
}

// OutputFunc receives command output as it arrives ("stdout" or "stderr").
type OutputFunc func(stream string, data []byte)

// Exec runs a command in sandbox id and waits for it. onOutput, if not nil,
// sees the output as it arrives; the result's Stdout and Stderr hold all of
// it either way. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest, onOutput OutputFunc) (*ExecResult, error) {
	return c.execAt(ctx, sandboxPath(id, ""), req, onOutput)
}

// execAt runs a command through POST base/exec (a sandbox's or a VM's).
func (c *Client) execAt(ctx context.Context, base string, req ExecRequest, onOutput OutputFunc) (*ExecResult, error) {
	var stdout, stderr strings.Builder
	return postStream(ctx, c, base+"/exec", nil, req, "exec", func(line *ExecLine) (bool, *ExecResult, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Exit != nil:
			res := line.Exit.ExecResult
			if res == nil { // {"exit": {}}: nothing the contract promises
				return true, nil, fmt.Errorf("read exec stream: an empty exit line")
			}
			res.Stdout, res.Stderr = stdout.String(), stderr.String()
			return true, res, nil
		case line.Stream != "":
			data, err := decoded(line)
			if err != nil {
				return true, nil, fmt.Errorf("read exec stream: %w", err)
			}
			if line.Stream == "stderr" {
				stderr.Write(data)
			} else {
				stdout.Write(data)
			}
			if onOutput != nil {
				onOutput(line.Stream, data)
			}
		}
		return false, nil, nil
	})
}

// WriteFile uploads size bytes from r to path in sandbox id, creating parent
// directories. mode 0 keeps an existing file's mode (0644 for a new file);
// appendTo appends instead of replacing.
func (c *Client) WriteFile(ctx context.Context, id, path string, mode uint32, appendTo bool, size int64, r io.Reader) (*FileResult, error) {
	return c.writeFileAt(ctx, sandboxPath(id, ""), path, modeText(mode), appendTo, size, r)
}

// WriteFileMode is WriteFile with the mode as octal text ("0755"; "" keeps
// an existing file's), sent as it is for the daemon to parse and refuse.
func (c *Client) WriteFileMode(ctx context.Context, id, path, mode string, appendTo bool, size int64, r io.Reader) (*FileResult, error) {
	return c.writeFileAt(ctx, sandboxPath(id, ""), path, mode, appendTo, size, r)
}

// modeText is mode as the files route's octal text ("" for 0).
func modeText(mode uint32) string {
	if mode == 0 {
		return ""
	}
	return "0" + strconv.FormatUint(uint64(mode), 8)
}

// writeFileAt uploads through PUT base/files (a sandbox's or a VM's).
func (c *Client) writeFileAt(ctx context.Context, base, path, mode string, appendTo bool, size int64, r io.Reader) (*FileResult, error) {
	q := url.Values{"path": {path}}
	if mode != "" {
		q.Set("mode", mode)
	}
	if appendTo {
		q.Set("append", "true")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.url(base+"/files", q), r)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	// The daemon needs the exact size up front; an explicit length also
	// stops net/http from falling back to chunked encoding.
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fr FileResult
	if err := json.NewDecoder(resp.Body).Decode(&fr); err != nil {
		return nil, fmt.Errorf("decode upload response: %w", err)
	}
	return &fr, nil
}

// ReadFile copies up to max bytes of path in sandbox id, starting at offset,
// to w (max 0: the daemon's largest transfer).
func (c *Client) ReadFile(ctx context.Context, id, path string, offset, max int64, w io.Writer) (*FileData, error) {
	return c.readFileAt(ctx, sandboxPath(id, ""), path, offset, max, w)
}

// readFileAt downloads through GET base/files (a sandbox's or a VM's).
func (c *Client) readFileAt(ctx context.Context, base, path string, offset, max int64, w io.Writer) (*FileData, error) {
	q := url.Values{"path": {path}}
	if offset != 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if max != 0 {
		q.Set("max_bytes", strconv.FormatInt(max, 10))
	}
	resp, err := c.send(ctx, http.MethodGet, base+"/files", q, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	fd := &FileData{Truncated: resp.Header.Get("X-File-Truncated") == "true"}
	if fd.Size, err = strconv.ParseInt(resp.Header.Get("X-File-Size"), 10, 64); err != nil {
		return nil, fmt.Errorf("download: bad X-File-Size header: %w", err)
	}
	if fd.N, err = io.Copy(w, resp.Body); err != nil {
		return fd, fmt.Errorf("download %s: %w", path, err)
	}
	if resp.ContentLength >= 0 && fd.N != resp.ContentLength {
		return fd, fmt.Errorf("download %s: got %d of %d bytes", path, fd.N, resp.ContentLength)
	}
	return fd, nil
}

// ListFiles lists path in sandbox id ("" for /workspace).
func (c *Client) ListFiles(ctx context.Context, id, path string, recursive bool) ([]FileEntry, error) {
	q := url.Values{"list": {"true"}}
	if path != "" {
		q.Set("path", path)
	}
	if recursive {
		q.Set("recursive", "true")
	}
	l, err := c.ListFilesPage(ctx, apitypes.FileListRequest{SandboxID: id, Path: path, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	return l.Entries, nil
}

// ListFilesPage lists a directory with the listing's total and whether
// the entries stop short of it (req.MaxEntries; 0: the daemon's default).
func (c *Client) ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	q := url.Values{"list": {"true"}}
	if req.Path != "" {
		q.Set("path", req.Path)
	}
	if req.Recursive {
		q.Set("recursive", "true")
	}
	if req.MaxEntries != 0 {
		q.Set("max_entries", strconv.Itoa(req.MaxEntries))
	}
	var l apitypes.FileList
	return &l, c.doJSON(ctx, http.MethodGet, sandboxPath(req.SandboxID, "/files"), q, nil, &l)
}

// DeleteFile deletes path in sandbox id (a directory tree with recursive).
func (c *Client) DeleteFile(ctx context.Context, id, path string, recursive bool) (*FileResult, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	var fr FileResult
	return &fr, c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "/files"), q, nil, &fr)
}
