package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListenFDRefusesHostileValues: --listen-fd names an inherited
// listening unix socket; stdio, files and other sockets are refused with a
// message naming the flag.
func TestListenFDRefusesHostileValues(t *testing.T) {
	for _, fd := range []string{"-1", "1", "2"} {
		if _, err := parseFlags([]string{"--listen-fd", fd}); err == nil || !strings.Contains(err.Error(), "--listen-fd") {
			t.Errorf("--listen-fd %s: err %v, want one naming --listen-fd", fd, err)
		}
	}
	f, err := os.CreateTemp(t.TempDir(), "not-a-socket")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := &options{socket: filepath.Join(t.TempDir(), "agent.sock"), listenFD: dupFD(t, f)}
	if ln, err := listen(o); err == nil || !strings.Contains(err.Error(), "--listen-fd") {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("a regular file as --listen-fd: err %v, want one naming --listen-fd", err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	tf, err := tcp.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	o.listenFD = dupFD(t, tf)
	if ln, err := listen(o); err == nil || !strings.Contains(err.Error(), "not a unix socket") {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("a TCP listener as --listen-fd: err %v, want not a unix socket", err)
	}
}

// TestListenFDServes: a socket bound by someone else (the daemon) and handed
// over as a descriptor accepts the connections made to its path, and the
// inherited descriptor itself is closed (commands never inherit it).
func TestListenFDServes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	f, err := ul.File()
	ul.Close()
	if err != nil {
		t.Fatal(err)
	}
	fd := dupFD(t, f)
	f.Close()
	// A client connecting before the agent serves is queued, not refused.
	early, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	o, err := parseFlags([]string{"--socket", path, "--listen-fd", strconv.Itoa(fd)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listen(o)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := os.Stat("/proc/self/fd/" + strconv.Itoa(fd)); !os.IsNotExist(err) {
		t.Fatalf("descriptor %d still open after listen (stat: %v)", fd, err)
	}
}

// dupFD returns a new descriptor (≥ 3) for f that the test owns.
func dupFD(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestJobsPidsFlag: --jobs-pids is a count of tasks, 0 for none of the
// jobs' own; a negative one is refused with a message naming the flag.
func TestJobsPidsFlag(t *testing.T) {
	for _, v := range []string{"-1", "x"} {
		if _, err := parseFlags([]string{"--jobs-pids", v}); err == nil || !strings.Contains(err.Error(), "jobs-pids") {
			t.Errorf("--jobs-pids %s: err %v, want one naming --jobs-pids", v, err)
		}
	}
	o, err := parseFlags([]string{"--jobs-pids", "48"})
	if err != nil || o.JobsPids != 48 {
		t.Fatalf("--jobs-pids 48: %+v, %v", o, err)
	}
}
