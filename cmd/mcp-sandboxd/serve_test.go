package main

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

func TestUIBaseURL(t *testing.T) {
	for addr, want := range map[string]string{
		"":               "",
		"127.0.0.1:7070": "http://127.0.0.1:7070",
		"0.0.0.0:7070":   "http://127.0.0.1:7070", // a browser cannot open the wildcard
		"[::]:7070":      "http://127.0.0.1:7070",
		":7070":          "http://127.0.0.1:7070",
		"[::1]:8080":     "http://[::1]:8080",
		"localhost:9000": "http://localhost:9000",
	} {
		if got := uiBaseURL(addr); got != want {
			t.Errorf("uiBaseURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestListenUnixReplacesInOneStep: a socket file with a dead daemon's
// listener behind it (here one that never accepts) is replaced by a rename:
// a client that connects afterwards reaches the new listener, the path has
// the configured mode, and no temporary name is left. A path too long for
// the temporary name is refused naming server.socket.
func TestListenUnixReplacesInOneStep(t *testing.T) {
	dir := t.TempDir()
	sc := config.Server{Socket: filepath.Join(dir, "api.sock"), SocketMode: "0600"}
	stale, err := net.Listen("unix", sc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	defer stale.Close()

	l, err := listenUnix(sc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", sc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(2 * time.Second))
	if a, err := l.Accept(); err != nil {
		t.Errorf("the new listener got no connection: %v", err)
	} else {
		a.Close()
	}
	_ = stale.(*net.UnixListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
	if a, err := stale.Accept(); err == nil {
		a.Close()
		t.Error("a client reached the replaced listener")
	}
	if st, err := os.Stat(sc.Socket); err != nil || st.Mode().Perm() != 0o600 || st.Mode().Type() != os.ModeSocket {
		t.Errorf("socket after replacement: %v %v", st.Mode(), err)
	}
	if _, err := os.Stat(sc.Socket + ".new"); !os.IsNotExist(err) {
		t.Errorf("temporary name left: %v", err)
	}

	long := config.Server{Socket: filepath.Join(dir, strings.Repeat("s", 104-len(dir))), SocketMode: "0600"}
	if _, err := listenUnix(long, slog.New(slog.DiscardHandler)); err == nil || !strings.HasPrefix(err.Error(), "server.socket:") || !strings.Contains(err.Error(), "too long") {
		t.Errorf("a socket path too long for its temporary name: %v", err)
	}
}
