package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
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

// listAgent answers a listing with n entries /d/e0.. and then the frame
// last (bare, result is the final frame of an agent that predates counted
// listings).
// result is the bare result frame.
const result = `{"v":1,"type":"result"}`

func listAgent(n int, last string) func(net.Conn) {
	return func(c net.Conn) {
		w := bufio.NewWriter(c)
		for i := range n {
			fmt.Fprintf(w, `{"v":1,"type":"entry","file":{"path":"/d/e%d","type":"file","mode":420}}`+"\n", i)
		}
		fmt.Fprintln(w, last)
		w.Flush()
	}
}

// TestClientListOldAgent: an agent that predates counted listings (in a
// sandbox started before the upgrade) ignores max and sends every entry;
// the client keeps max of them and counts the rest itself. Whole listings
// work with it as they did.
func TestClientListOldAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := agent.NewClient(agent.UnixDialer(fakeAgent(t, listAgent(500, result))))
	l, err := c.ListFilesMax(ctx, "/d", false, 100)
	if err != nil || len(l.Entries) != 100 || l.Total != 500 || !l.Truncated || l.Entries[99].Path != "/d/e99" {
		t.Fatalf("max 100 of an old agent's 500: %+v, %v", l, err)
	}
	l, err = c.ListFilesMax(ctx, "/d", false, 500)
	if err != nil || len(l.Entries) != 500 || l.Total != 500 || l.Truncated {
		t.Fatalf("max 500 of an old agent's 500: %d entries, total %d, truncated %v, %v", len(l.Entries), l.Total, l.Truncated, err)
	}
	whole, err := c.ListFiles(ctx, "/d", false)
	if err != nil || len(whole) != 500 {
		t.Fatalf("whole listing from an old agent: %d entries, %v", len(whole), err)
	}
	// Up to its cap an old agent's listing is counted; past it, it
	// refuses after sending the cap's entries, and so does the client.
	atCap := agent.NewClient(agent.UnixDialer(fakeAgent(t, listAgent(agent.MaxListEntries, result))))
	if l, err := atCap.ListFilesMax(ctx, "/d", false, 10); err != nil || len(l.Entries) != 10 || l.Total != agent.MaxListEntries || !l.Truncated {
		t.Fatalf("max 10 of an old agent's %d: %d entries, total %d, %v", agent.MaxListEntries, len(l.Entries), l.Total, err)
	}
	pastCap := agent.NewClient(agent.UnixDialer(fakeAgent(t, listAgent(agent.MaxListEntries,
		`{"v":1,"type":"error","error":{"code":"limit_exceeded","message":"more than 100000 entries"}}`))))
	if l, err := pastCap.ListFilesMax(ctx, "/d", false, 10); agent.ErrorCode(err) != errdefs.LimitExceeded {
		t.Fatalf("an old agent past its cap: %+v, %v; want limit_exceeded", l, err)
	}
}

// TestClientListBounds: a counting agent that sends more than max entries,
// or a count that contradicts what it sent, is a protocol error; a whole
// listing the agent says it cut is limit_exceeded.
func TestClientListBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		n    int
		last string
		max  int
	}{
		{"more than max", 3, `{"v":1,"type":"result","list":{"total":3}}`, 2},
		{"total below the entries", 2, `{"v":1,"type":"result","list":{"total":1}}`, 2},
		{"truncated without more", 2, `{"v":1,"type":"result","list":{"total":2,"truncated":true}}`, 2},
		{"more without truncated", 2, `{"v":1,"type":"result","list":{"total":9}}`, 2},
	} {
		c := agent.NewClient(agent.UnixDialer(fakeAgent(t, listAgent(tc.n, tc.last))))
		if l, err := c.ListFilesMax(ctx, "/d", false, tc.max); !errors.Is(err, agent.ErrProtocol) {
			t.Errorf("%s: %+v, %v; want ErrProtocol", tc.name, l, err)
		}
	}
	c := agent.NewClient(agent.UnixDialer(fakeAgent(t, listAgent(2, `{"v":1,"type":"result","list":{"total":9,"truncated":true}}`))))
	if l, err := c.ListFilesMax(ctx, "/d", false, 2); err != nil || len(l.Entries) != 2 || l.Total != 9 || !l.Truncated {
		t.Errorf("a counted cut listing: %+v, %v", l, err)
	}
	if _, err := c.ListFiles(ctx, "/d", false); agent.ErrorCode(err) != errdefs.LimitExceeded {
		t.Errorf("a whole listing the agent cut: %v, want limit_exceeded", err)
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

// TestRunOlderAgent: an agent that predates Request.Follow answers a
// start with its result and closes; Client.Run then attaches and forgets
// on connections of their own and returns the same outcome.
func TestRunOlderAgent(t *testing.T) {
	const jobID = "j-0123456789abcdef"
	var mu sync.Mutex
	var got []agent.Request
	sock := filepath.Join(t.TempDir(), "old.sock")
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
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				var req agent.Request
				if err := json.Unmarshal([]byte(line), &req); err != nil {
					return
				}
				mu.Lock()
				got = append(got, req)
				mu.Unlock()
				switch req.Op { // what an agent without Follow answers
				case agent.OpStart:
					fmt.Fprintf(c, `{"v":1,"type":"result","job_id":%q}`+"\n", jobID)
				case agent.OpAttach:
					fmt.Fprint(c, `{"v":1,"type":"output","stream":"stdout","offset":0,"len":2}`+"\nhi")
					fmt.Fprint(c, `{"v":1,"type":"exit","exit":{"cause":"exited","exit_code":4,"stdout_bytes":2}}`+"\n")
				case agent.OpForget:
					fmt.Fprint(c, `{"v":1,"type":"result"}`+"\n")
				}
			}()
		}
	}()
	c := agent.NewClient(agent.UnixDialer(sock))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started, out := "", ""
	exit, err := c.Run(ctx, agent.ExecRequest{Argv: []string{"true"}, HoldOutput: true}, func(id string) { started = id }, func(ch agent.Chunk) error {
		out += string(ch.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if started != jobID || out != "hi" || exit.ExitCode != 4 {
		t.Errorf("started %q, output %q, exit %+v; want %s, hi, 4", started, out, exit, jobID)
	}
	mu.Lock()
	defer mu.Unlock()
	var ops []string
	for _, r := range got {
		ops = append(ops, r.Op)
	}
	if fmt.Sprint(ops) != "[start attach forget]" || !got[0].Follow || got[1].JobID != jobID || got[2].JobID != jobID {
		t.Errorf("requests %+v, want start (follow), attach and forget of %s", got, jobID)
	}
}
