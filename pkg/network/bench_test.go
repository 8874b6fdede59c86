package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// Setup cost of a sandbox's network: a namespace alone (none) versus a
// namespace, lease, rules and veth (egress) while the host side is up.
func BenchmarkAttach(b *testing.B) {
	for _, mode := range []Mode{ModeNone, ModeEgress} {
		b.Run(string(mode), func(b *testing.B) {
			tp := newTopology(b)
			m := tp.manager(b, nil)
			attach(b, m, "sb-anchor", Request{Policy: Policy{Mode: ModeEgress}}) // keeps the host side up
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("sb-bench-%d", i)
				if _, err := m.Attach(ctx, id, Request{Policy: Policy{Mode: mode}}, nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := m.Detach(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// Download throughput through the bridge and NAT versus the same download
// from the host namespace directly.
func BenchmarkDownload(b *testing.B) {
	const size = 64 << 20
	tp := newTopology(b)
	m := tp.manager(b, nil)
	a := attach(b, m, "sb-nat", Request{Policy: Policy{Mode: ModeEgress}})
	download := func(b *testing.B) error {
		conn, err := net.DialTimeout("tcp4", upstreamAddr1+":80", 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /bytes?n=%d HTTP/1.0\r\n\r\n", size)
		n, err := io.Copy(io.Discard, conn)
		if err != nil {
			return err
		}
		if n < size {
			return fmt.Errorf("short read: %d", n)
		}
		return nil
	}
	b.Run("nat", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if err := inSandbox(b, a, func() error { return download(b) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("host", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if err := InNetNS(tp.hostNS, func() error { return download(b) }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
