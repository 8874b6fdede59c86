package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// chunkSize is how much one request moves when a copy goes in pieces:
// downloads always (neither side holds a whole file in memory), uploads from
// stdin (whose length is unknown up front).
const chunkSize = 8 << 20

func cpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file between this host and a sandbox (ID:/path on one side, - for stdin/stdout)",
		Long: `Copy one file, byte for byte, between this host and a sandbox. Exactly one
of SRC and DST is ID:/path. A DST ending in / (in a sandbox) or naming an
existing directory (here) receives the file under its source name. "-" reads
from stdin or writes to stdout.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, to, err := parseCopy(args[0], args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if to.remote() {
				return upload(cmd.Context(), c, from.path, to)
			}
			return download(cmd.Context(), g, c, from, to.path)
		},
	}
}

func upload(ctx context.Context, c *client.Client, src string, to location) error {
	if strings.HasSuffix(to.path, "/") {
		if src == "-" {
			return usagef("cp: DST must name a file when SRC is -")
		}
		to.path += filepath.Base(src)
	}
	if src == "-" {
		return uploadChunks(ctx, c, os.Stdin, to)
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("cp: %s is not a regular file (directories are not supported)", src)
	}
	_, err = c.WriteFile(ctx, to.sandbox, to.path, uint32(st.Mode().Perm()), false, st.Size(), f)
	return err
}

// uploadChunks writes r of unknown length in pieces: the first replaces the
// file, the others append to it.
func uploadChunks(ctx context.Context, c *client.Client, r io.Reader, to location) error {
	buf := make([]byte, chunkSize)
	for first := true; ; first = false {
		n, err := io.ReadFull(r, buf)
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("read stdin: %w", err)
		}
		if n > 0 || first {
			if _, werr := c.WriteFile(ctx, to.sandbox, to.path, 0, !first, int64(n), bytes.NewReader(buf[:n])); werr != nil {
				return werr
			}
		}
		if err != nil { // EOF or a short last chunk
			return nil
		}
	}
}

func download(ctx context.Context, g *globals, c *client.Client, from location, dst string) error {
	if dst == "-" {
		return readAll(ctx, c, from, g.stdout)
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(from.path))
	}
	// Write next to dst and rename at the end, so that a failed copy never
	// leaves a partial file or clobbers an existing one.
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".sandboxctl-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	err = readAll(ctx, c, from, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// readAll copies a file out of a sandbox chunk by chunk.
func readAll(ctx context.Context, c *client.Client, from location, w io.Writer) error {
	for off := int64(0); ; {
		fd, err := c.ReadFile(ctx, from.sandbox, from.path, off, chunkSize, w)
		if err != nil {
			return err
		}
		off += fd.N
		if !fd.Truncated {
			return nil
		}
		if fd.N == 0 {
			return fmt.Errorf("cp: the daemon sent no data for %s at byte %d of %d", from.path, off, fd.Size)
		}
	}
}
