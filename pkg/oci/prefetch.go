package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Parallel layer download: layers are unpacked in order, one after the
// other (each applies onto what the ones below made), but their
// compressed blobs can be fetched at once. A pull starts up to
// parallelDownloads fetches of the blobs the layer store does not hold,
// each into a spool file beside the layer store, checked against its
// digest and its manifest size, while the unpacking goes on in order from
// the spooled files. A blob never exceeds images.max_size.

// parallelDownloads bounds the blobs one pull fetches at once.
const parallelDownloads = 3

// prefetch is one blob being fetched.
type prefetch struct {
	done chan struct{}
	path string
	err  error
}

// startPrefetch fetches the blobs of layers (of a registry or a layout:
// compressed sources) not in the layer store, at most parallelDownloads
// at once; it returns one entry per layer (nil: not fetched ahead) and a
// function that waits for the fetches and removes their spool files.
func (im *Importer) startPrefetch(ctx context.Context, layers []v1.Layer, diffIDs []v1.Hash) ([]*prefetch, func()) {
	out := make([]*prefetch, len(layers))
	ctx, cancel := context.WithCancel(ctx)
	sem := make(chan struct{}, parallelDownloads)
	var wg sync.WaitGroup
	for i, l := range layers {
		if _, err := os.Stat(im.layers + "/" + diffIDs[i].Hex); err == nil {
			continue
		}
		p := &prefetch{done: make(chan struct{})}
		out[i] = p
		wg.Add(1)
		go func(i int, l v1.Layer) {
			defer wg.Done()
			defer close(p.done)
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				p.err = ctx.Err()
				return
			}
			defer func() { <-sem }()
			p.path, p.err = im.fetchBlob(ctx, l, fmt.Sprintf("%d (%s)", i, diffIDs[i]))
		}(i, l)
	}
	return out, func() {
		cancel()
		wg.Wait()
		for _, p := range out {
			if p != nil && p.path != "" {
				os.Remove(p.path)
			}
		}
	}
}

// fetchBlob copies l's compressed blob into a spool file, checking its
// digest and size, and returns the file's path.
func (im *Importer) fetchBlob(ctx context.Context, l v1.Layer, name string) (string, error) {
	want, err := l.Digest()
	if err != nil {
		return "", im.sourceError("layer "+name, err)
	}
	size, err := l.Size()
	if err != nil {
		return "", im.sourceError("layer "+name, err)
	}
	if size > im.o.MaxSize {
		return "", errdefs.LimitExceededf("image: layer %s: blob of %d bytes exceeds images.max_size (%d bytes)", name, size, im.o.MaxSize)
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", im.sourceError("layer "+name, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(im.layers, ".partial-blob-")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	// One byte more than the manifest says: a longer blob is refused
	// without reading the rest.
	n, err := io.Copy(io.MultiWriter(f, h), &ctxReader{ctx: ctx, r: io.LimitReader(rc, size+1)})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		err = im.sourceError("layer "+name, err)
	case n != size:
		err = errdefs.Invalidf("image: layer %s: blob is not the %d bytes the manifest says", name, size)
	case hex.EncodeToString(h.Sum(nil)) != want.Hex:
		err = errdefs.Invalidf("image: layer %s: digest mismatch: manifest names %s, blob is sha256:%s", name, want, hex.EncodeToString(h.Sum(nil)))
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
