package agent_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestDialPort relays a TCP stream through the agent: bytes both ways, a
// half-close passed on, a refused port and an invalid one reported with
// their codes. The agent here runs in the test's own network namespace, so
// its loopback is the test's.
func TestDialPort(t *testing.T) {
	a := startAgent(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		// Upper-case each line until the client half-closes, then say bye.
		sc := bufio.NewScanner(c)
		n := 0
		for sc.Scan() {
			n++
			_, _ = io.WriteString(c, strings.ToUpper(sc.Text())+"\n")
		}
		_, _ = io.WriteString(c, "bye\n")
		served <- strings.Repeat("x", n)
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := a.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	for _, line := range []string{"hello", "world"} {
		if _, err := io.WriteString(conn, line+"\n"); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != strings.ToUpper(line)+"\n" {
			t.Fatalf("echo of %q = %q, %v", line, got, err)
		}
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "bye\n" {
		t.Fatalf("after half-close: %q, %v", rest, err)
	}
	if got := <-served; got != "xx" {
		t.Fatalf("server saw %q", got)
	}

	// A port nobody listens on: the listener is closed, its port free.
	ln.Close()
	if _, err := a.DialPort(ctx, port); agent.ErrorCode(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "port") {
		t.Fatalf("refused port: %v", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := a.DialPort(ctx, p); agent.ErrorCode(err) != errdefs.InvalidArgument {
			t.Fatalf("port %d: %v", p, err)
		}
	}
}
