package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strconv"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// maxFile is the largest file /files moves, the agent's bound.
const maxFile = agent.MaxTransferBytes

// signature is envd's signature of a pre-signed /files URL:
// v1_ + base64(sha256("path:operation:user:token[:expiration]")).
func signature(p, op, user, token, exp string) string {
	raw := p + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedOK checks a request's signature against a sandbox's token.
func signedOK(r *http.Request, token string) bool {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
	}
	want := signature(q.Get("path"), op, q.Get("username"), token, exp)
	return subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) == 1
}

// signedSandbox finds the sandbox whose token signed r: a pre-signed URL
// carries no routing headers, its signature is what names the sandbox.
func (s *Server) signedSandbox(r *http.Request) string {
	all, err := s.b.ListSandboxes(r.Context(), "")
	if err != nil {
		return ""
	}
	for _, sb := range all {
		if tok := sb.Labels[labelToken]; tok != "" && isE2B(sb) && signedOK(r, tok) {
			return ToE2B(sb.ID)
		}
	}
	return ""
}

// filesAuth checks /files access: the access token or a valid signature
// for a secure sandbox; and returns the user.
func filesAuth(w http.ResponseWriter, r *http.Request, c *envdCall) (string, bool) {
	if tok := c.sb.Labels[labelToken]; tok != "" {
		hdr := subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) == 1
		if !hdr && !signedOK(r, tok) {
			writeError(w, http.StatusUnauthorized, "X-Access-Token or a valid signature is required for a secure sandbox")
			return "", false
		}
	}
	user, err := checkUser(r.URL.Query().Get("username"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, "username: %s", errdefs.MessageOf(err))
		return "", false
	}
	return user, true
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	user, ok := filesAuth(w, r, c)
	if !ok {
		return
	}
	p, err := resolve(user, r.URL.Query().Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	data, err := s.b.ReadFileRaw(r.Context(), apitypes.FileReadRequest{SandboxID: c.sb.ID, Path: p, MaxBytes: maxFile})
	if err != nil {
		writeErr(w, err)
		return
	}
	if data.Truncated {
		writeError(w, http.StatusRequestEntityTooLarge, "path: %s is larger than %d bytes", p, maxFile)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Content-Length", strconv.Itoa(len(data.Data)))
	_, _ = w.Write(data.Data)
}

type writtenJSON struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// uploadBody is an upload's body, bounded, gunzipped when its
// Content-Encoding says gzip.
func uploadBody(w http.ResponseWriter, r *http.Request) (io.Reader, error) {
	body := io.Reader(http.MaxBytesReader(w, r.Body, maxFile+1<<20))
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, errdefs.Invalidf("body: invalid gzip: %v", err)
		}
		return zr, nil
	default:
		return nil, errdefs.Invalidf("Content-Encoding: %q is not supported (gzip is)", enc)
	}
}

// uploadFile writes one uploaded file, at most maxFile bytes, to dest
// resolved for user.
func (s *Server) uploadFile(ctx context.Context, sandboxID, user, dest string, rd io.Reader) (writtenJSON, error) {
	p, err := resolve(user, dest)
	if err != nil {
		return writtenJSON{}, err
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(rd, maxFile+1))
	if err != nil {
		return writtenJSON{}, errdefs.Invalidf("body: %v", err)
	}
	if n > maxFile {
		return writtenJSON{}, errdefs.Invalidf("body: file larger than %d bytes", maxFile)
	}
	if _, err := s.b.WriteFileFrom(ctx, sandboxID, p, "", false, n, &buf); err != nil {
		return writtenJSON{}, err
	}
	return writtenJSON{Path: p, Name: path.Base(p), Type: "file"}, nil
}

// upload serves POST /files: multipart parts named file, or one
// octet-stream body, each written whole.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	user, ok := filesAuth(w, r, c)
	if !ok {
		return
	}
	body, err := uploadBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	qpath := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenJSON
	write := func(dest string, rd io.Reader) error {
		wj, err := s.uploadFile(r.Context(), c.sb.ID, user, dest, rd)
		if err == nil {
			out = append(out, wj)
		}
		return err
	}
	switch mt {
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "body: invalid multipart: %v", err)
				return
			}
			if part.FormName() != "file" {
				continue
			}
			dest := qpath
			if dest == "" {
				// The part's filename is the whole destination path;
				// Part.FileName would keep only its last element.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dest = dp["filename"]
			}
			if err := write(dest, part); err != nil {
				writeErr(w, err)
				return
			}
		}
	case "application/octet-stream", "":
		if qpath == "" {
			writeError(w, http.StatusBadRequest, "path: required with an octet-stream body")
			return
		}
		if err := write(qpath, body); err != nil {
			writeErr(w, err)
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "Content-Type: %q is not multipart/form-data or application/octet-stream", mt)
		return
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "body: no part named file")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// relay serves a user port of a sandbox (getHost): the port is exposed
// through the engine's preview relay and the request forwarded over the
// sandbox's agent, so servers bound to the sandbox's loopback are reached.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, e2bID string, port int) {
	id, ok := FromE2B(e2bID)
	if !ok || port < 1 {
		sandboxGone(w, e2bID, "The sandbox was not found")
		return
	}
	sb, err := s.b.GetSandbox(r.Context(), id)
	if err != nil || !sb.State.Live() || !isE2B(&sb.Sandbox) {
		sandboxGone(w, e2bID, "The sandbox was not found")
		return
	}
	if _, err := s.b.ExposePort(r.Context(), apitypes.ExposePortRequest{SandboxID: id, Port: port}); err != nil {
		writeErr(w, err)
		return
	}
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host = "http", net.JoinHostPort(id, strconv.Itoa(port))
	out.RequestURI = ""
	out.Header.Del("E2b-Sandbox-Id")
	out.Header.Del("E2b-Sandbox-Port")
	s.proxy.ServeHTTP(w, out)
}

// newProxy relays to sandbox ports; the transport's address is
// "{sandbox_id}:{port}", so pooled connections never cross sandboxes.
func (s *Server) newProxy() (*httputil.ReverseProxy, *http.Transport) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, ps, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(ps)
			if err != nil {
				return nil, err
			}
			return s.b.DialExposed(ctx, host, port)
		},
		MaxIdleConnsPerHost:   8,
		MaxConnsPerHost:       64,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetXForwarded(); pr.Out.Host = pr.In.Host },
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			id, ps, _ := net.SplitHostPort(r.URL.Host)
			writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": ToE2B(id), "port": ps,
				"message": "The sandbox is running but port " + ps + " is not open: " + errdefs.MessageOf(err), "code": http.StatusBadGateway})
		},
	}, tr
}
