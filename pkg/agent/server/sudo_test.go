package server

import (
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// countFDs counts this process's open descriptors.
func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// sudoPair is a connected pair: the agent's end and a client's.
func sudoPair(t *testing.T) (agentEnd, client *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sudo")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestSudoRequestHostileDescriptors: a client that sends the wrong number
// of descriptors, or a second set, is refused, and the agent keeps none of
// them open.
func TestSudoRequestHostileDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs [][]int // descriptors sent with each message
	}{
		{"two descriptors", [][]int{{0, 1}}},
		{"four descriptors", [][]int{{0, 1, 2, 2}}},
		{"a second set", [][]int{{0, 1, 2}, {0, 1, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, c := sudoPair(t)
			defer a.Close()
			defer c.Close()
			before := countFDs(t)
			for i, fds := range tc.msgs {
				data := []byte(`{"argv":["id"],`)
				if i == len(tc.msgs)-1 {
					data = []byte(`"uid":0}` + "\n")
				}
				if _, _, err := c.WriteMsgUnix(data, unix.UnixRights(fds...), nil); err != nil {
					t.Fatal(err)
				}
			}
			_, _, _, err := readSudoRequest(a)
			if err == nil || !strings.Contains(err.Error(), "want 3 once") {
				t.Fatalf("readSudoRequest: %v, want a refusal naming the descriptors", err)
			}
			if after := countFDs(t); after != before {
				t.Errorf("descriptors open: %d before, %d after the refusal", before, after)
			}
		})
	}
}
