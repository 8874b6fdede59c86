package agent

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzReadFrame: the daemon's side of the agent protocol decodes whatever a
// compromised agent sends into a frame or ErrProtocol/EOF, never a panic,
// never more than MaxLineBytes buffered, never a payload length out of range.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte(`{"v":1,"type":"result","len":0}` + "\n"))
	f.Add([]byte(`{"v":1,"type":"output","stream":"stdout","len":5}` + "\nhello"))
	f.Add([]byte(`{"v":1,"type":"error","error":{"code":"not_found","message":"x"}}` + "\n"))
	f.Add([]byte(`{"v":1,"len":-1}` + "\n"))
	f.Add([]byte(`{"v":2}` + "\n"))
	f.Add([]byte(strings.Repeat("x", 70000)))
	f.Add([]byte(`{"v":1}{"v":1}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		for range 8 {
			fr, err := ReadFrame(r, 1<<20)
			if err != nil {
				if !errors.Is(err, ErrProtocol) && !errors.Is(err, io.EOF) {
					t.Fatalf("ReadFrame error outside the protocol's: %v", err)
				}
				return
			}
			if fr.Len < 0 || fr.Len > 1<<20 || fr.V != ProtocolVersion {
				t.Fatalf("accepted frame %+v", fr)
			}
			if _, err := io.CopyN(io.Discard, r, fr.Len); err != nil {
				return
			}
		}
	})
}

// FuzzValidatePath: a path the agent accepts is absolute, clean, NUL-free
// and cannot climb out of the root lexically.
func FuzzValidatePath(f *testing.F) {
	for _, s := range []string{"/", "/workspace/a", "/../etc/passwd", "a/b", "/a//b", "/a/./b", "/a\x00b", "/.sandboxd/run", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if ValidatePath(p) != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") || strings.Contains(p, "//") ||
			strings.Contains(p+"/", "/../") || strings.Contains(p+"/", "/./") || len(p) > 4096 {
			t.Fatalf("ValidatePath accepted %q", p)
		}
	})
}
