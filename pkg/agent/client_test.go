package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// fakeAgent answers every request with reply, whatever was asked.
func fakeAgent(t *testing.T, reply func(net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// Take the request first, so the client is reading.
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				reply(c)
			}()
		}
	}()
	return sock
}

func TestClientBoundsMaliciousAgent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply func(net.Conn)
		call  func(context.Context, *agent.Client) error
	}{
		{
			name: "endless line",
			reply: func(c net.Conn) {
				junk := bytes.Repeat([]byte("A"), 64<<10)
				for {
					if _, err := c.Write(junk); err != nil {
						return
					}
				}
			},
			call: func(ctx context.Context, c *agent.Client) error { _, err := c.Ping(ctx); return err },
		},
		{
			name:  "garbage json",
			reply: func(c net.Conn) { c.Write([]byte("{{{not json\n")) },
			call:  func(ctx context.Context, c *agent.Client) error { _, err := c.Ping(ctx); return err },
		},
		{
			name:  "wrong version",
			reply: func(c net.Conn) { c.Write([]byte(`{"v":7,"type":"result","info":{"pid":1}}` + "\n")) },
			call:  func(ctx context.Context, c *agent.Client) error { _, err := c.Ping(ctx); return err },
		},
		{
			name: "huge payload claim",
			reply: func(c net.Conn) {
				c.Write([]byte(`{"v":1,"type":"output","stream":"stdout","len":1099511627776}` + "\n"))
			},
			call: func(ctx context.Context, c *agent.Client) error {
				_, err := c.Attach(ctx, "j-0123456789abcdef", 0, 0, func(agent.Chunk) error { return nil })
				return err
			},
		},
		{
			name:  "file data larger than asked",
			reply: func(c net.Conn) { c.Write([]byte(`{"v":1,"type":"result","len":100,"data":{"size":100}}` + "\n")) },
			call: func(ctx context.Context, c *agent.Client) error {
				_, err := c.ReadFile(ctx, "/f", 0, 10)
				return err
			},
		},
		{
			name: "offset going back",
			reply: func(c net.Conn) {
				c.Write([]byte(`{"v":1,"type":"output","stream":"stdout","offset":0,"len":1}` + "\nx"))
			},
			call: func(ctx context.Context, c *agent.Client) error {
				_, err := c.Attach(ctx, "j-0123456789abcdef", 5, 0, func(agent.Chunk) error { return nil })
				return err
			},
		},
		{
			name:  "unknown cause",
			reply: func(c net.Conn) { c.Write([]byte(`{"v":1,"type":"exit","exit":{"cause":"bogus"}}` + "\n")) },
			call: func(ctx context.Context, c *agent.Client) error {
				_, err := c.Attach(ctx, "j-0123456789abcdef", 0, 0, func(agent.Chunk) error { return nil })
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := agent.NewClient(agent.UnixDialer(fakeAgent(t, tc.reply)))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := tc.call(ctx, c)
			if !errors.Is(err, agent.ErrProtocol) {
				t.Errorf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

func TestClientHonoursDeadline(t *testing.T) {
	// An agent that accepts and never answers.
	c := agent.NewClient(agent.UnixDialer(fakeAgent(t, func(c net.Conn) { time.Sleep(time.Minute) })))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Ping(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("err = %v after %v", err, time.Since(start))
	}
}

func TestClientUnavailable(t *testing.T) {
	c := agent.NewClient(agent.UnixDialer(filepath.Join(t.TempDir(), "none.sock")))
	_, err := c.Ping(context.Background())
	if !errors.Is(err, agent.ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
}

func TestReadLineBound(t *testing.T) {
	_, err := agent.ReadLine(bufioReaderString(strings.Repeat("x", 100)+"\n"), 50)
	if !errors.Is(err, agent.ErrProtocol) {
		t.Errorf("err = %v", err)
	}
	line, err := agent.ReadLine(bufioReaderString("exactly\nrest"), 7)
	if err != nil || string(line) != "exactly" {
		t.Errorf("line %q err %v", line, err)
	}
}

func bufioReaderString(s string) *bufio.Reader { return bufio.NewReaderSize(strings.NewReader(s), 16) }
