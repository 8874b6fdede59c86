package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// The server is not tied to unix sockets: a VM backend hands it a
// virtio-serial or vsock stream. Here every request travels over an
// in-memory net.Pipe, which has neither a file descriptor nor socket options.
func TestServeOverAnyConn(t *testing.T) {
	_, c := newPipeServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != os.Getpid() || info.Protocol != agent.ProtocolVersion {
		t.Fatalf("ping = %+v", info)
	}
	content := bytes.Repeat([]byte("virtio "), 10000)
	if _, err := c.WriteFile(ctx, agent.WriteFileRequest{Path: "/w/f.txt", Mode: 0o644, Size: int64(len(content)), MkdirParents: true}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	d, err := c.ReadFile(ctx, "/w/f.txt", 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.Data, content) {
		t.Fatalf("read back %d bytes, want %d", len(d.Data), len(content))
	}
	if _, err := c.ReadFile(ctx, "/.private/x", 0, 10); agent.ErrorCode(err) == "" {
		t.Fatalf("file operation in the private dir: %v, want a refusal", err)
	}
}

// newPipeServer is a server on a temporary root whose client reaches it
// over in-memory net.Pipe connections (no descriptor, no socket options);
// the server is closed when the test ends.
func newPipeServer(t *testing.T) (*Server, *agent.Client) {
	t.Helper()
	root := t.TempDir()
	private := filepath.Join(root, ".private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	srv, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Options{
		Root: root, PrivateDir: private, UID: os.Getuid(), GID: os.Getgid(), RetainBytes: 4096, MaxFinished: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		client, server := net.Pipe()
		go srv.ServeConn(server)
		return client, nil
	})
	return srv, c
}
