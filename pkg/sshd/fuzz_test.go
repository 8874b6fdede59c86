package sshd

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// fuzzBackend serves one sandbox, sb-live, whose commands end at once; it
// records what the server asked of it.
type fuzzBackend struct {
	key ssh.PublicKey

	mu    sync.Mutex
	procs []apitypes.ProcessRequest
	dials []int
}

func (b *fuzzBackend) KeyOwner(_ context.Context, pub ssh.PublicKey) (principal.Principal, error) {
	if string(pub.Marshal()) == string(b.key.Marshal()) {
		return principal.Principal{KeyID: "sk-1", Admin: true}, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("not registered")
}

func (b *fuzzBackend) RedeemToken(string, string, bool) (principal.Principal, error) {
	return principal.Principal{}, errdefs.Unauthenticatedf("token: unknown")
}

func (b *fuzzBackend) Access(_ context.Context, id string) error {
	if id != "sb-live" {
		return errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
	}
	return nil
}

// endedProcess is a command that printed nothing and exited 0.
type endedProcess struct{ chunks chan agent.Chunk }

func (p endedProcess) JobID() string                  { return "j-1" }
func (p endedProcess) Chunks() <-chan agent.Chunk     { return p.chunks }
func (p endedProcess) Write(b []byte) (int, error)    { return len(b), nil }
func (p endedProcess) CloseStdin() error              { return nil }
func (p endedProcess) Resize(rows, cols uint16) error { return nil }
func (p endedProcess) Close() error                   { return nil }
func (p endedProcess) Wait() (*apitypes.ExecResult, error) {
	return &apitypes.ExecResult{Termination: apitypes.Termination{Cause: apitypes.CauseExited}}, nil
}

func (b *fuzzBackend) OpenProcess(_ context.Context, req apitypes.ProcessRequest) (Process, error) {
	b.mu.Lock()
	b.procs = append(b.procs, req)
	b.mu.Unlock()
	ch := make(chan agent.Chunk)
	close(ch)
	return endedProcess{ch}, nil
}

func (b *fuzzBackend) KillJob(_ context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	return &apitypes.JobKillResult{JobID: req.JobID, Signal: req.Signal, State: "finished"}, nil
}

func (b *fuzzBackend) Exec(context.Context, apitypes.ExecRequest) (*apitypes.ExecResult, error) {
	return nil, errdefs.Unavailablef("not in this test")
}

func (b *fuzzBackend) StatFile(_ context.Context, _, p string) (*apitypes.FileEntry, error) {
	return nil, errdefs.NotFoundf("path: %s: no such file", p)
}

func (b *fuzzBackend) ListFilesPage(_ context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	return nil, errdefs.NotFoundf("path: %s: no such file", req.Path)
}

func (b *fuzzBackend) ReadFileRaw(_ context.Context, req apitypes.FileReadRequest) (*agent.FileData, error) {
	return nil, errdefs.NotFoundf("path: %s: no such file", req.Path)
}

func (b *fuzzBackend) WriteFileFrom(_ context.Context, _, p, _ string, _ bool, _ int64, _ io.Reader) (*apitypes.FileResult, error) {
	return nil, errdefs.PermissionDeniedf("path: %s: read-only here", p)
}

func (b *fuzzBackend) DeleteFile(_ context.Context, _, p string, _ bool) (*apitypes.FileResult, error) {
	return nil, errdefs.NotFoundf("path: %s: no such file", p)
}

// DialPort answers with a connection closed at its far end.
func (b *fuzzBackend) DialPort(_ context.Context, _ string, port int) (net.Conn, error) {
	b.mu.Lock()
	b.dials = append(b.dials, port)
	b.mu.Unlock()
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

func (b *fuzzBackend) SubscribeEvents(ctx context.Context, _ string) <-chan apitypes.Event {
	ch := make(chan apitypes.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

// taken resets and returns what the backend was asked since the last call.
func (b *fuzzBackend) taken() ([]apitypes.ProcessRequest, []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, d := b.procs, b.dials
	b.procs, b.dials = nil, nil
	return p, d
}

// directTCPIPPayload is RFC 4254's direct-tcpip channel data.
type directTCPIPPayload struct {
	Host     string
	Port     uint32
	OrigHost string
	OrigPort uint32
}

// FuzzSessionRequests sends, over a real SSH connection, a session
// request of any type and payload (or a direct-tcpip channel open of any
// payload), then starts a command, and checks what reached the engine:
// an env request is accepted only for the allow-listed names with a
// bounded, NUL-free value, and a command's environment holds nothing else;
// a terminal has a size; a forward is dialled only for a loopback host and
// a port in 1-65535, and its payload decodes to what was sent.
func FuzzSessionRequests(f *testing.F) {
	type sshString struct{ S string }
	f.Add(false, "env", ssh.Marshal(struct{ Name, Value string }{"LANG", "C.UTF-8"}))
	f.Add(false, "env", ssh.Marshal(struct{ Name, Value string }{"LD_PRELOAD", "/tmp/x.so"}))
	f.Add(false, "env", ssh.Marshal(struct{ Name, Value string }{"LC_ALL", "a\x00b"}))
	f.Add(false, "pty-req", ssh.Marshal(ptyRequest{Term: "xterm-256color", Cols: 80, Rows: 24, Modes: "\x00"}))
	f.Add(false, "pty-req", ssh.Marshal(ptyRequest{Term: strings.Repeat("x", 100), Cols: 1 << 20}))
	f.Add(false, "window-change", ssh.Marshal(windowChange{Cols: 0xffffffff, Rows: 0}))
	f.Add(false, "exec", ssh.Marshal(sshString{"echo hi; exit 3"}))
	f.Add(false, "subsystem", ssh.Marshal(sshString{"sftp"}))
	f.Add(false, "subsystem", ssh.Marshal(sshString{"netconf"}))
	f.Add(false, "signal", ssh.Marshal(sshString{"KILL"}))
	f.Add(false, "auth-agent-req@openssh.com", []byte(nil))
	f.Add(false, "x11-req", []byte{0, 0, 0, 1})
	f.Add(true, "", ssh.Marshal(directTCPIPPayload{"localhost", 8000, "127.0.0.1", 5555}))
	f.Add(true, "", ssh.Marshal(directTCPIPPayload{"10.0.0.1", 22, "", 0}))
	f.Add(true, "", ssh.Marshal(directTCPIPPayload{"::1", 70000, "", 0}))
	f.Add(true, "", []byte{0, 0, 0, 9, 'l'})

	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(hostPriv)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := ssh.NewSignerFromKey(userPriv)
	b := &fuzzBackend{key: user.PublicKey()}
	srv := New(b, Options{HostKey: host, Log: slog.New(slog.DiscardHandler)})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	client, err := ssh.Dial("tcp", l.Addr().String(), &ssh.ClientConfig{User: "sb-live", Auth: []ssh.AuthMethod{ssh.PublicKeys(user)},
		HostKeyCallback: ssh.FixedHostKey(host.PublicKey()), Timeout: time.Minute})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		client.Close()
		l.Close()
		srv.Close()
		<-done
	})

	f.Fuzz(func(t *testing.T, forward bool, reqType string, payload []byte) {
		b.taken()
		if forward {
			ch, reqs, err := client.OpenChannel("direct-tcpip", payload)
			var oce *ssh.OpenChannelError
			switch {
			case err == nil:
				go ssh.DiscardRequests(reqs)
				_ = ch.Close()
			case !errors.As(err, &oce):
				t.Fatalf("direct-tcpip %q: %v (the connection broke)", payload, err)
			}
			_, dials := b.taken()
			var dst directTCPIPPayload
			decoded := ssh.Unmarshal(payload, &dst) == nil
			loop := map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true, "ip6-localhost": true}[dst.Host]
			switch {
			case len(dials) > 1:
				t.Fatalf("direct-tcpip %q: dialled %v", payload, dials)
			case len(dials) == 1 && (!decoded || !loop || dials[0] != int(dst.Port) || dst.Port < 1 || dst.Port > 65535):
				t.Fatalf("direct-tcpip %q (%+v): dialled port %d", payload, dst, dials[0])
			case len(dials) == 0 && err == nil:
				t.Fatalf("direct-tcpip %q: accepted without a dial", payload)
			case decoded && loop && dst.Port >= 1 && dst.Port <= 65535 && len(dials) == 0:
				t.Fatalf("direct-tcpip %+v: a valid forward was not dialled (%v)", dst, err)
			}
			return
		}
		ch, reqs, err := client.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("session: %v", err)
		}
		go ssh.DiscardRequests(reqs)
		defer ch.Close()
		ok, err := ch.SendRequest(reqType, true, payload)
		if err != nil {
			t.Fatalf("%s %q: %v (the connection broke)", reqType, payload, err)
		}
		if reqType == "env" && ok {
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(payload, &kv) != nil || !allowedEnv(kv.Name) || len(kv.Value) > 4096 || strings.ContainsRune(kv.Value, 0) {
				t.Fatalf("env %q accepted", payload)
			}
		}
		// Start a command (refused when the request above started one)
		// and check the process request the session made.
		_, _ = ch.SendRequest("exec", true, ssh.Marshal(sshString{"true"}))
		procs, dials := b.taken()
		if len(dials) > 0 {
			t.Fatalf("%s %q: dialled %v", reqType, payload, dials)
		}
		if len(procs) > 1 {
			t.Fatalf("%s %q: one session started %d commands", reqType, payload, len(procs))
		}
		for _, pr := range procs {
			if pr.SandboxID != "sb-live" || pr.Root {
				t.Fatalf("%s %q: process request %+v", reqType, payload, pr)
			}
			for k, v := range pr.Env {
				if !allowedEnv(k) || len(v) > 4096 || strings.ContainsRune(v, 0) {
					t.Fatalf("%s %q: environment %q=%q", reqType, payload, k, v)
				}
				if k == "TERM" && (len(v) > 64 || strings.ContainsAny(v, "\n")) {
					t.Fatalf("%s %q: TERM %q", reqType, payload, v)
				}
			}
			if pr.TTY && (pr.Rows == 0 || pr.Cols == 0) {
				t.Fatalf("%s %q: terminal %dx%d", reqType, payload, pr.Cols, pr.Rows)
			}
			if len(pr.Argv) < 5 || pr.Argv[0] != "/bin/sh" {
				t.Fatalf("%s %q: argv %q", reqType, payload, pr.Argv)
			}
		}
	})
}
