package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Artifact is an exported tar.gz of a sandbox directory (files_export).
type Artifact = apitypes.Artifact

// artifactsDir holds exported archives, <id>.tar.gz with <id>.json beside.
func (e *Engine) artifactsDir() string { return filepath.Join(e.cfg.Paths.StateDir, "artifacts") }

// ExportFiles packs a directory of a sandbox (default /workspace) into a
// tar.gz kept by the daemon, downloadable by its id (REST
// /v1/artifacts/{id}) after the sandbox is gone. The archive is made inside
// the sandbox as the sandbox user, so it holds exactly what that user can
// read; it is limited by sandbox.output_limit.
func (e *Engine) ExportFiles(ctx context.Context, id, dir string) (*Artifact, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = "/workspace"
	}
	if err := checkPath("path", dir); err != nil {
		return nil, err
	}
	dir = path.Clean(dir)
	if err := os.MkdirAll(e.artifactsDir(), 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create artifacts dir")
	}
	art := &Artifact{ID: newArtifactID(), SandboxID: id, Path: dir, CreatedAt: time.Now().UTC()}
	file := filepath.Join(e.artifactsDir(), art.ID+".tar.gz")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create artifact")
	}
	keep := false
	defer func() {
		f.Close()
		if !keep {
			os.Remove(file)
		}
	}()
	w := &hashingWriter{w: f, h: sha256.New()}
	var writeErr error
	res, err := e.sandboxes.Exec(ctx, id, sandbox.ExecSpec{
		Argv: []string{"tar", "-czf", "-", "-C", dir, "."}, Timeout: e.cfg.Sandbox.ExecTimeout.D(), MaxResultBytes: 64 << 10,
	}, func(stream string, data []byte) {
		if stream == "stdout" && writeErr == nil {
			_, writeErr = w.Write(data)
		}
	})
	if err != nil {
		return nil, err
	}
	if writeErr != nil {
		return nil, errdefs.Wrap(errdefs.Internal, writeErr, "write artifact")
	}
	if res.Termination.Cause == sandbox.CauseOutputLimit {
		return nil, errdefs.LimitExceededf("path: %s packs to more than sandbox.output_limit (%d bytes)", dir, e.cfg.Sandbox.OutputLimit)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(res.Stderr)
		if strings.Contains(msg, "No such file or directory") || strings.Contains(msg, "Cannot open") {
			return nil, errdefs.NotFoundf("path: %s: %s", dir, msg)
		}
		return nil, errdefs.Invalidf("path: cannot archive %s: %s (exit %d, %s)", dir, msg, res.ExitCode, res.Termination.Cause)
	}
	art.Size, art.SHA256 = w.n, hex.EncodeToString(w.h.Sum(nil))
	meta, err := json.Marshal(art)
	if err == nil {
		err = os.WriteFile(filepath.Join(e.artifactsDir(), art.ID+".json"), meta, 0o600)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "record artifact")
	}
	keep = true
	return art, nil
}

// OpenArtifact opens an exported archive for download.
func (e *Engine) OpenArtifact(ctx context.Context, id string) (*Artifact, io.ReadCloser, error) {
	if !validArtifactID(id) {
		return nil, nil, errdefs.Invalidf("artifact_id: malformed %q", id)
	}
	meta, err := os.ReadFile(filepath.Join(e.artifactsDir(), id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, errdefs.NotFoundf("artifact_id: no artifact %q", id)
	}
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "read artifact %s", id)
	}
	var art Artifact
	if err := json.Unmarshal(meta, &art); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "decode artifact %s", id)
	}
	f, err := os.Open(filepath.Join(e.artifactsDir(), id+".tar.gz"))
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "open artifact %s", id)
	}
	return &art, f, nil
}

// pruneArtifacts deletes archives older than runs.max_age, the retention of
// the run records they usually belong with.
func (e *Engine) pruneArtifacts() {
	maxAge := e.cfg.Runs.MaxAge.D()
	ents, err := os.ReadDir(e.artifactsDir())
	if err != nil || maxAge <= 0 {
		return
	}
	for _, ent := range ents {
		fi, err := ent.Info()
		if err == nil && time.Since(fi.ModTime()) > maxAge {
			_ = os.Remove(filepath.Join(e.artifactsDir(), ent.Name()))
		}
	}
}

func newArtifactID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	return "art-" + hex.EncodeToString(b[:])
}

func validArtifactID(id string) bool {
	if len(id) != len("art-")+16 || !strings.HasPrefix(id, "art-") {
		return false
	}
	_, err := hex.DecodeString(id[4:])
	return err == nil
}

// hashingWriter writes through and keeps a digest and a byte count.
type hashingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (hw *hashingWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	hw.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("artifact: %w", err)
	}
	return n, nil
}
