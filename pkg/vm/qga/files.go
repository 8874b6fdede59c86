package qga

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// openFile opens path in the guest and returns the agent's handle.
func (c *Client) openFile(ctx context.Context, path, mode string) (int64, error) {
	if path == "" {
		return 0, errdefs.Invalidf("path: required")
	}
	var h int64
	if err := c.Call(ctx, "guest-file-open", map[string]string{"path": path, "mode": mode}, &h); err != nil {
		return 0, err
	}
	return h, nil
}

// closeFile closes a handle. It runs even when the caller's context has
// ended: a handle left open stays open in qemu-ga until it restarts.
func (c *Client) closeFile(ctx context.Context, h int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return c.Call(ctx, "guest-file-close", map[string]int64{"handle": h}, nil)
}

// WriteFile creates or truncates path in the guest and writes everything r
// yields, in WriteChunk pieces. It returns the number of bytes written.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader) (n int64, err error) {
	h, err := c.openFile(ctx, path, "wb")
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := c.closeFile(ctx, h); err == nil && cerr != nil {
			err = cerr
		}
	}()
	buf := make([]byte, WriteChunk)
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			var rep struct {
				Count int64 `json:"count"`
			}
			args := map[string]any{"handle": h, "buf-b64": base64.StdEncoding.EncodeToString(buf[:k])}
			if err := c.Call(ctx, "guest-file-write", args, &rep); err != nil {
				return n, err
			}
			if rep.Count != int64(k) {
				// qemu-ga writes with one fwrite; a short count is a full
				// disk or an I/O error in the guest.
				return n + rep.Count, errdefs.Unavailablef("qga guest-file-write %s: wrote %d of %d bytes", path, rep.Count, k)
			}
			n += int64(k)
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			return n, nil
		default:
			return n, rerr
		}
	}
}

// ReadFile reads path from the guest in ReadChunk pieces. A file longer
// than limit bytes is an error (limit_exceeded), not a silent truncation.
func (c *Client) ReadFile(ctx context.Context, path string, limit int64) (data []byte, err error) {
	h, err := c.openFile(ctx, path, "rb")
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := c.closeFile(ctx, h); err == nil && cerr != nil {
			err = cerr
		}
	}()
	for {
		var rep struct {
			Count int64  `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if err := c.Call(ctx, "guest-file-read", map[string]int64{"handle": h, "count": ReadChunk}, &rep); err != nil {
			return nil, err
		}
		b, err := b64(rep.Buf)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "qga guest-file-read %s: buf-b64", path)
		}
		if int64(len(b)) != rep.Count || len(b) > ReadChunk {
			return nil, errdefs.Unavailablef("qga guest-file-read %s: count %d but %d bytes", path, rep.Count, len(b))
		}
		if int64(len(data)+len(b)) > limit {
			return nil, errdefs.LimitExceededf("path: %s is larger than %d bytes", path, limit)
		}
		data = append(data, b...)
		if rep.EOF || len(b) == 0 {
			return data, nil
		}
	}
}

// seekPos is guest-file-seek's reply.
type seekPos struct {
	Position int64 `json:"position"`
	EOF      bool  `json:"eof"`
}

// ReadFileAt reads at most max bytes of path from offset (ReadChunk
// pieces) and returns them with the file's size, found by seeking to its
// end: a page of a file of any size.
func (c *Client) ReadFileAt(ctx context.Context, path string, offset, max int64) (data []byte, size int64, err error) {
	if offset < 0 || max < 0 {
		return nil, 0, errdefs.Invalidf("offset: must not be negative")
	}
	h, err := c.openFile(ctx, path, "rb")
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		if cerr := c.closeFile(ctx, h); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var pos seekPos
	if err := c.Call(ctx, "guest-file-seek", map[string]any{"handle": h, "offset": 0, "whence": "end"}, &pos); err != nil {
		return nil, 0, err
	}
	size = pos.Position
	if offset >= size || max == 0 {
		return nil, size, nil
	}
	if err := c.Call(ctx, "guest-file-seek", map[string]any{"handle": h, "offset": offset, "whence": "set"}, &pos); err != nil {
		return nil, 0, err
	}
	if pos.Position != offset {
		return nil, 0, errdefs.Unavailablef("qga guest-file-seek %s: at %d, not %d", path, pos.Position, offset)
	}
	for int64(len(data)) < max {
		want := min(int64(ReadChunk), max-int64(len(data)))
		var rep struct {
			Count int64  `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if err := c.Call(ctx, "guest-file-read", map[string]int64{"handle": h, "count": want}, &rep); err != nil {
			return nil, 0, err
		}
		b, err := b64(rep.Buf)
		if err != nil {
			return nil, 0, errdefs.Wrap(errdefs.Unavailable, err, "qga guest-file-read %s: buf-b64", path)
		}
		if int64(len(b)) != rep.Count || int64(len(b)) > want {
			return nil, 0, errdefs.Unavailablef("qga guest-file-read %s: count %d but %d bytes", path, rep.Count, len(b))
		}
		data = append(data, b...)
		if rep.EOF || len(b) == 0 {
			break
		}
	}
	return data, size, nil
}
