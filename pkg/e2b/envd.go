package e2b

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process/processconnect"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The users of an E2B sandbox: "user" (uid 1000, E2B's default) and root.
const (
	userUser = "user"
	userRoot = "root"
)

// envdCall is what the data plane knows about a request once routed.
type envdCall struct {
	sb    *apitypes.SandboxDetail
	e2bID string
	user  string
}

type envdKey struct{}

// maxRPCBytes bounds one RPC request message.
const maxRPCBytes = 4 << 20

func callOf(ctx context.Context) *envdCall { c, _ := ctx.Value(envdKey{}).(*envdCall); return c }

func home(user string) string {
	if user == userRoot {
		return "/root"
	}
	return "/home/user"
}

// resolve makes p absolute as envd does: relative paths and ~ are taken
// from the user's home.
func resolve(user, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalidf("path: required")
	case strings.ContainsRune(p, 0):
		return "", errdefs.Invalidf("path: contains a NUL byte")
	case p == "~":
		return home(user), nil
	case strings.HasPrefix(p, "~/"):
		return path.Join(home(user), p[2:]), nil
	case !strings.HasPrefix(p, "/"):
		return path.Join(home(user), p), nil
	}
	return path.Clean(p), nil
}

// userOf reads the user envd's RPCs run as from Authorization: Basic
// base64("user:"); none is the default user.
func userOf(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return userUser, nil
	}
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", errdefs.New(errdefs.Unauthenticated, "Authorization: only Basic with a user name is understood")
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", errdefs.New(errdefs.Unauthenticated, "Authorization: invalid base64")
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return checkUser(name)
}

func checkUser(name string) (string, error) {
	switch name {
	case "", userUser:
		return userUser, nil
	case userRoot:
		return userRoot, nil
	}
	return "", errdefs.New(errdefs.Unauthenticated, "user: %s is not a user of this sandbox (user, root)", quote(name))
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return "\"" + s + "\""
}

// sandboxGone is E2B's proxy answer for a sandbox that is not there: the
// SDKs read 502 as "not running".
func sandboxGone(w http.ResponseWriter, e2bID, why string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": e2bID, "message": why, "code": http.StatusBadGateway})
}

// dataPlane serves envd: /health, /files and the two Connect services.
func (s *Server) dataPlane() http.Handler {
	mux := http.NewServeMux()
	// Bounded like the agent's stdin chunks: no RPC message of envd's
	// carries more (SendInput is the largest).
	opts := connect.WithReadMaxBytes(maxRPCBytes)
	mux.Handle(processconnect.NewProcessHandler(&processService{s}, opts))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s}, opts))
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e2bID := r.Context().Value(sandboxKey{}).(string)
		id, ok := FromE2B(e2bID)
		if !ok {
			sandboxGone(w, e2bID, "The sandbox was not found")
			return
		}
		sb, err := s.b.GetSandbox(r.Context(), id)
		if err != nil || !sb.State.Live() || !isE2B(&sb.Sandbox) {
			sandboxGone(w, e2bID, "The sandbox was not found")
			return
		}
		if sb.State == apitypes.StatePaused {
			sandboxGone(w, e2bID, "The sandbox is paused (connect resumes it)")
			return
		}
		c := &envdCall{sb: sb, e2bID: e2bID}
		audit.CallFrom(r.Context()).SetPrincipal(envdPrincipal)
		// envd lets /health and /files through without the token:
		// /files then checks it or a signature itself.
		if r.URL.Path != "/health" && r.URL.Path != "/files" {
			if tok := sb.Labels[labelToken]; tok != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) != 1 {
				rpcUnauthenticated(w, r, "X-Access-Token: missing or wrong access token of a secure sandbox")
				return
			}
			if c.user, err = userOf(r); err != nil {
				rpcUnauthenticated(w, r, errdefs.MessageOf(err))
				return
			}
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), envdKey{}, c)))
	})
}

// rpcUnauthenticated refuses an RPC before its handler, in the protocol it
// came in: Connect's error body for Connect, which the SDKs show with its
// message (E2B's {code: 401} body they show as "HTTP 401"); a trailers-only
// answer (status in the headers) for gRPC and gRPC-web, whose clients read
// no JSON body (found by FuzzEnvdRPC).
func rpcUnauthenticated(w http.ResponseWriter, r *http.Request, msg string) {
	if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/grpc") {
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Grpc-Status", strconv.Itoa(int(connect.CodeUnauthenticated)))
		w.Header().Set("Grpc-Message", grpcPercentEncode(msg))
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusUnauthorized, map[string]string{"code": connect.CodeUnauthenticated.String(), "message": msg})
}

// grpcPercentEncode encodes a grpc-message value as the gRPC HTTP/2
// protocol says: bytes outside printable ASCII, and '%', as %XX.
func grpcPercentEncode(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// connectErr is err as a Connect error, its code from the taxonomy.
func connectErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch errdefs.CodeOf(err) {
	case errdefs.InvalidArgument:
		code = connect.CodeInvalidArgument
	case errdefs.NotFound:
		code = connect.CodeNotFound
	case errdefs.Conflict:
		code = connect.CodeFailedPrecondition
	case errdefs.LimitExceeded:
		code = connect.CodeResourceExhausted
	case errdefs.Unavailable:
		code = connect.CodeUnavailable
	case errdefs.Unauthenticated:
		code = connect.CodeUnauthenticated
	case errdefs.PermissionDenied:
		code = connect.CodePermissionDenied
	}
	return connect.NewError(code, errors.New(errdefs.MessageOf(err)))
}
