package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// ReadLine reads one '\n'-terminated line from r without the terminator,
// failing with ErrProtocol instead of buffering more than max bytes. It
// returns io.EOF only when r ends cleanly before any byte of a new line.
func ReadLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max+1 { // +1: the terminator is not counted
			return nil, fmt.Errorf("%w: header line longer than %d bytes", ErrProtocol, max)
		}
		switch err {
		case nil:
			line = append(line, frag[:len(frag)-1]...)
			return line, nil
		case bufio.ErrBufferFull:
			line = append(line, frag...)
		case io.EOF:
			if len(line)+len(frag) == 0 {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("%w: truncated header line", ErrProtocol)
		default:
			return nil, err
		}
	}
}

// WriteHeader writes v as one JSON line.
func WriteHeader(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode header: %w", err)
	}
	if len(b) > MaxLineBytes {
		return Errorf(errdefs.LimitExceeded, "header of %d bytes exceeds %d", len(b), MaxLineBytes)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// ReadFrame reads and decodes one frame header, checking the protocol
// version and the payload length against maxLen. It does not read the
// payload.
func ReadFrame(r *bufio.Reader, maxLen int64) (*Frame, error) {
	line, err := ReadLine(r, MaxLineBytes)
	if err != nil {
		return nil, err
	}
	var f Frame
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: decode frame: %v", ErrProtocol, err)
	}
	if f.V != ProtocolVersion {
		return nil, fmt.Errorf("%w: protocol version %d, want %d", ErrProtocol, f.V, ProtocolVersion)
	}
	if f.Len < 0 || f.Len > maxLen {
		return nil, fmt.Errorf("%w: %s frame payload of %d bytes exceeds %d", ErrProtocol, f.Type, f.Len, maxLen)
	}
	return &f, nil
}
