package testenv

import (
	"net"
	"sync"
	"testing"
)

// handedOut holds every loopback port FreeAddr has returned in this test
// process. A port is picked by binding 127.0.0.1:0 and closing the listener
// before the daemon binds it, so the kernel may hand the same port out again
// at the next pick (CI saw the daemon's HTTP and E2B listeners collide);
// remembering them makes two picks in one process always differ.
var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// FreeAddr returns a loopback host:port that was free a moment ago and that
// no earlier FreeAddr call in this process returned.
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 64 {
		// Holding the rejected listeners open until the end keeps the
		// kernel from offering the same port again in this loop.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if !handedOut[port] {
			handedOut[port] = true
			return l.Addr().String()
		}
	}
	t.Fatal("no loopback port free after 64 tries")
	return ""
}
