package server

import (
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Signals reach every channel registered for them through the C handler's
// pipe, a full channel does not hold the others back (the signal
// coalesces), and a stopped channel hears nothing more.
func TestSignalsRelayed(t *testing.T) {
	a, b := make(chan os.Signal, 1), make(chan os.Signal, 1)
	if err := notifySignals(a, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if err := notifySignals(b, syscall.SIGUSR2, syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	defer stopSignals(b)
	expect := func(c chan os.Signal, name string, want os.Signal) {
		t.Helper()
		select {
		case got := <-c:
			if got != want {
				t.Fatalf("%s got %v, want %v", name, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no %v within 10 s", name, want)
		}
	}
	for range 3 { // a's buffer of one is full after the first
		if err := unix.Kill(os.Getpid(), unix.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		expect(b, "b", syscall.SIGUSR2)
	}
	expect(a, "a", syscall.SIGUSR2)
	stopSignals(a)
	if err := unix.Kill(os.Getpid(), unix.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	expect(b, "b", syscall.SIGWINCH)
	if err := unix.Kill(os.Getpid(), unix.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	expect(b, "b", syscall.SIGUSR2)
	select {
	case s := <-a:
		t.Fatalf("a stopped, yet got %v", s)
	default:
	}
}
