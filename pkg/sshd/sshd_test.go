package sshd

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

func TestParseUser(t *testing.T) {
	for user, want := range map[string]struct {
		id   string
		root bool
		ok   bool
	}{
		"sb-0123456789ab":               {"sb-0123456789ab", false, true},
		"sb-0123456789ab+root":          {"sb-0123456789ab", true, true},
		"root":                          {},
		"sb-a/b":                        {},
		"sb-a+root+root":                {},
		"sb-a@b":                        {},
		"sb-" + strings.Repeat("a", 70): {},
		"":                              {},
	} {
		id, root, err := parseUser(user)
		if (err == nil) != want.ok || id != want.id || root != want.root {
			t.Errorf("parseUser(%q) = %q, %v, %v", user, id, root, err)
		}
		if err != nil && !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("parseUser(%q): %v is not invalid_argument", user, err)
		}
	}
}

func TestAllowedEnv(t *testing.T) {
	for name, want := range map[string]bool{
		"LANG": true, "LC_ALL": true, "LC_TIME": true, "TERM": true, "TZ": true, "COLORTERM": true,
		"LD_PRELOAD": false, "PATH": false, "LC_": false, "LC_x": false, "BASH_ENV": false, "HOME": false,
	} {
		if got := allowedEnv(name); got != want {
			t.Errorf("allowedEnv(%q) = %v, want %v", name, got, want)
		}
	}
}

// fakeBackend records which calls reached it; a refused login must reach
// no sandbox operation.
type fakeBackend struct {
	Backend
	key ssh.PublicKey

	mu     sync.Mutex
	access []string
	opened int
	files  map[string]string
}

func (f *fakeBackend) KeyOwner(_ context.Context, pub ssh.PublicKey) (principal.Principal, error) {
	if string(pub.Marshal()) == string(f.key.Marshal()) {
		return principal.Principal{KeyID: "sk-1", Admin: true}, nil
	}
	return principal.Principal{}, errdefs.Unauthenticatedf("not registered")
}

func (f *fakeBackend) RedeemToken(tok, id string, root bool) (principal.Principal, error) {
	return principal.Principal{}, errdefs.Unauthenticatedf("token: unknown, already used or expired")
}

func (f *fakeBackend) Access(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, _ := principal.From(ctx)
	if o := principal.OriginFrom(ctx); o.FrontEnd != "ssh" || p.KeyID != "sk-1" {
		return errdefs.Invalidf("context carries %+v from %+v", p, o)
	}
	f.access = append(f.access, id)
	if id != "sb-live" {
		return errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
	}
	return nil
}

func (f *fakeBackend) OpenProcess(context.Context, apitypes.ProcessRequest) (Process, error) {
	f.mu.Lock()
	f.opened++
	f.mu.Unlock()
	return nil, errdefs.Unavailablef("fake")
}

func (f *fakeBackend) SubscribeEvents(ctx context.Context, _ string) <-chan apitypes.Event {
	ch := make(chan apitypes.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

func TestRefusedLogins(t *testing.T) {
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(hostPriv)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := ssh.NewSignerFromKey(userPriv)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewSignerFromKey(otherPriv)
	f := &fakeBackend{key: user.PublicKey()}
	srv := New(f, Options{HostKey: host})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		l.Close()
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	dial := func(name string, auth ssh.AuthMethod) (string, error) {
		var banner strings.Builder
		c, err := ssh.Dial("tcp", l.Addr().String(), &ssh.ClientConfig{User: name, Auth: []ssh.AuthMethod{auth},
			HostKeyCallback: ssh.FixedHostKey(host.PublicKey()), Timeout: 10 * time.Second,
			BannerCallback: func(m string) error { banner.WriteString(m); return nil }})
		if err == nil {
			c.Close()
		}
		return banner.String(), err
	}
	token := ssh.KeyboardInteractive(func(_, _ string, q []string, _ []bool) ([]string, error) {
		return []string{"sbt_guess"}, nil
	})
	for _, tc := range []struct {
		name, user string
		auth       ssh.AuthMethod
		banner     string
	}{
		{"password", "sb-live", ssh.Password("hunter2"), "password authentication is not offered"},
		{"unregistered key", "sb-live", ssh.PublicKeys(other), ""},
		{"bad token", "sb-live", token, "token refused"},
		{"no sandbox user", "admin", ssh.PublicKeys(user), "must be a sandbox id"},
		{"unknown sandbox", "sb-gone", ssh.PublicKeys(user), `no sandbox "sb-gone"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			banner, err := dial(tc.user, tc.auth)
			if err == nil {
				t.Fatal("logged in")
			}
			if tc.banner != "" && !strings.Contains(banner, tc.banner) {
				t.Errorf("banner %q, want %q", banner, tc.banner)
			}
			if tc.banner == "" && banner != "" {
				t.Errorf("banner %q to an unauthenticated client", banner)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Only the registered key's login looked a sandbox up, and no
	// refusal started anything in one.
	if len(f.access) != 1 || f.access[0] != "sb-gone" || f.opened != 0 {
		t.Errorf("sandbox lookups %v, processes opened %d", f.access, f.opened)
	}
}

func TestLimits(t *testing.T) {
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(hostPriv)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := ssh.NewSignerFromKey(userPriv)
	srv := New(&fakeBackend{key: user.PublicKey()}, Options{HostKey: host, MaxHandshakes: 2})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		l.Close()
		srv.Close()
		<-done
	}()
	greeting := func(c net.Conn) string {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 64)
		n, _ := c.Read(b)
		return string(b[:n])
	}
	// Two connections that never authenticate hold both handshake slots
	// (each got the server's greeting, so it is in its handshake).
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if g := greeting(c); !strings.HasPrefix(g, "SSH-2.0-mcp-sandboxd") {
			t.Fatalf("greeting %q", g)
		}
		idle = append(idle, c)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if g := greeting(c); g != "" {
		t.Errorf("a third authenticating connection was served: %q", g)
	}
	c.Close()
	// A slot frees when a handshake ends.
	idle[0].Close()
	var client *ssh.Client
	deadline := time.Now().Add(10 * time.Second)
	for client == nil && time.Now().Before(deadline) {
		client, err = ssh.Dial("tcp", l.Addr().String(), &ssh.ClientConfig{User: "sb-live", Auth: []ssh.AuthMethod{ssh.PublicKeys(user)},
			HostKeyCallback: ssh.FixedHostKey(host.PublicKey()), Timeout: 10 * time.Second})
	}
	if client == nil {
		t.Fatalf("no login after a slot freed: %v", err)
	}
	defer client.Close()
	// At most maxSessions sessions per connection: one more open is
	// refused at the open, saying why. The opens race each other (as a
	// client multiplexing commands does): each must see the slots the
	// others took, however the server's goroutines are scheduled.
	errs := make(chan error, maxSessions+1)
	for range maxSessions + 1 {
		go func() {
			_, err := client.NewSession()
			errs <- err
		}()
	}
	var opened, refused int
	for range maxSessions + 1 {
		var oce *ssh.OpenChannelError
		switch err := <-errs; {
		case err == nil:
			opened++
		case errors.As(err, &oce) && oce.Reason == ssh.ResourceShortage && strings.Contains(oce.Message, "at most 10 sessions"):
			refused++
		default:
			t.Errorf("session open: %v", err)
		}
	}
	if opened != maxSessions || refused != 1 {
		t.Errorf("%d concurrent opens: %d opened, %d refused; want %d and 1", maxSessions+1, opened, refused, maxSessions)
	}
}

// WriteFileFrom keeps what an SFTP upload sent.
func (f *fakeBackend) WriteFileFrom(_ context.Context, id, path, _ string, _ bool, size int64, r io.Reader) (*apitypes.FileResult, error) {
	b, err := io.ReadAll(r)
	if err != nil || int64(len(b)) != size {
		return nil, errdefs.Invalidf("content: read %d of %d bytes: %v", len(b), size, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.files == nil {
		f.files = map[string]string{}
	}
	f.files[path] = string(b)
	return &apitypes.FileResult{Path: path, Size: size}, nil
}

func TestSFTPHandleLimit(t *testing.T) {
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(hostPriv)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := ssh.NewSignerFromKey(userPriv)
	f := &fakeBackend{key: user.PublicKey()}
	srv := New(f, Options{HostKey: host})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		l.Close()
		srv.Close()
		<-done
	}()
	c, err := ssh.Dial("tcp", l.Addr().String(), &ssh.ClientConfig{User: "sb-live", Auth: []ssh.AuthMethod{ssh.PublicKeys(user)},
		HostKeyCallback: ssh.FixedHostKey(host.PublicKey()), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	var open []*sftp.File
	for i := range maxHandles {
		w, err := sc.Create(fmt.Sprintf("f%d", i))
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		open = append(open, w)
	}
	if _, err := sc.Create("one-too-many"); err == nil || !strings.Contains(err.Error(), "at most 32 files open") {
		t.Errorf("open %d: %v, want refused", maxHandles+1, err)
	}
	// Closing one sends it (relative paths start at /workspace) and frees
	// its slot.
	if _, err := open[0].Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := open[0].Close(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.files["/workspace/f0"]
	f.mu.Unlock()
	if got != "hello" {
		t.Errorf("uploaded %q", got)
	}
	w, err := sc.Create("after")
	if err != nil {
		t.Fatalf("open after a close: %v", err)
	}
	w.Close()
	for _, w := range open[1:] {
		w.Close()
	}
}

// TestKeepalive: a client that stops answering (its network gone: here a
// relay that stops moving bytes) is disconnected after three keep-alive
// intervals; one that answers stays.
func TestKeepalive(t *testing.T) {
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(hostPriv)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := ssh.NewSignerFromKey(userPriv)
	srv := New(&fakeBackend{key: user.PublicKey()}, Options{HostKey: host, Keepalive: 100 * time.Millisecond})
	defer srv.Close()
	// The server's side of the connection, and a relay to the client that
	// can be frozen.
	serverSide, relayIn := net.Pipe()
	relayOut, clientSide := net.Pipe()
	served := make(chan struct{})
	go func() { srv.ServeConn(serverSide); close(served) }()
	var frozen atomic.Bool
	pump := func(dst, src net.Conn) {
		b := make([]byte, 32<<10)
		for {
			n, err := src.Read(b)
			if err != nil {
				dst.Close()
				return
			}
			// Frozen, the network loses everything both ways.
			if frozen.Load() {
				continue
			}
			if _, err := dst.Write(b[:n]); err != nil {
				return
			}
		}
	}
	go pump(relayOut, relayIn)
	go pump(relayIn, relayOut)
	sc, chans, reqs, err := ssh.NewClientConn(clientSide, "sshd", &ssh.ClientConfig{User: "sb-live",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(user)}, HostKeyCallback: ssh.FixedHostKey(host.PublicKey())})
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(sc, chans, reqs)
	defer c.Close()
	// Answering, the connection outlives many intervals.
	select {
	case <-served:
		t.Fatal("a client that answers keep-alives was disconnected")
	case <-time.After(time.Second):
	}
	frozen.Store(true)
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("a silent client is still connected 10s later (keep-alive every 100ms)")
	}
}
