package vport

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// chardev simulates QEMU's chardev socket + virtio-serial port: each host
// dial yields a pipe whose other end the guest's next open gets.
type chardev struct{ guest chan net.Conn }

func (c *chardev) dial(ctx context.Context) (net.Conn, error) {
	h, g := net.Pipe()
	select {
	case c.guest <- g:
		return h, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *chardev) open() (io.ReadWriteCloser, error) { return <-c.guest, nil }

func TestStreamsSurviveReconnect(t *testing.T) {
	cd := &chardev{guest: make(chan net.Conn)}
	l := listen("test", cd.open, slog.New(slog.DiscardHandler))
	defer l.Close()
	// An echo agent: one request per connection.
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	h := &Session{path: "test", dial: cd.dial}
	defer h.Close()
	roundTrip := func(msg string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := h.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo %q: %q %v", msg, buf, err)
		}
	}
	// Several connections over one session, concurrently.
	done := make(chan struct{})
	for i := range 4 {
		go func() { defer func() { done <- struct{}{} }(); roundTrip(string(rune('a' + i))) }()
	}
	for range 4 {
		<-done
	}
	// The host side goes away (daemon restart, restore): a new session works.
	h.Reset()
	roundTrip("after reset")
	h2 := &Session{path: "test", dial: cd.dial}
	defer h2.Close()
	h.Close()
	h = h2
	roundTrip("new host")
}

// dropWrites loses what the guest writes, like a port written while no
// host is connected.
type dropWrites struct{ net.Conn }

func (d dropWrites) Write(p []byte) (int, error) { return len(p), nil }

func TestLostAnnouncementRedials(t *testing.T) {
	cd := &chardev{guest: make(chan net.Conn)}
	first := true
	open := func() (io.ReadWriteCloser, error) {
		c := <-cd.guest
		if first {
			first = false
			return dropWrites{c}, nil
		}
		return c, nil
	}
	l := listen("test", open, slog.New(slog.DiscardHandler))
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	h := &Session{path: "test", dial: cd.dial}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := h.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d := time.Since(t0); d < readyTimeout {
		t.Fatalf("used the first session (%v) although its announcement was lost", d)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'x' {
		t.Fatalf("echo: %q %v", buf, err)
	}
}
