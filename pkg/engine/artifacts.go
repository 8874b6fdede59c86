package engine

import (
	"context"
	"io"
	"path"
	"path/filepath"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/artifacts"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Artifact is an exported tar.gz of a sandbox directory (files_export).
type Artifact = apitypes.Artifact

// BlockedSyscall is a syscall seccomp refused and how often.
type BlockedSyscall = apitypes.BlockedSyscall

func (e *Engine) artifacts() *artifacts.Store {
	return artifacts.Open(filepath.Join(e.cfg.Paths.StateDir, "artifacts"))
}

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
	// The archive streams out of our agent; a guest agent returns output
	// at the end, as text, cut at the result's size.
	if err := e.sandboxes.Require(ctx, id, sandbox.CapFileList); err != nil {
		return nil, err
	}
	// The archive belongs to the sandbox's tenant (also when an admin
	// exports it), so that its owner can download it.
	sb, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	w, err := e.artifacts().Create(id, sb.Tenant, dir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "export %s", dir)
	}
	defer w.Abort()
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
	art, err := w.Commit()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "export %s", dir)
	}
	art.DownloadPath = ArtifactPath(art.ID)
	return art, nil
}

// OpenArtifact opens an exported archive for download: not_found for
// another tenant's.
func (e *Engine) OpenArtifact(ctx context.Context, id string) (*Artifact, io.ReadCloser, error) {
	return e.artifacts().Open(ctx, id)
}

// pruneArtifacts deletes archives older than runs.max_age, the retention of
// the run records they usually belong with.
func (e *Engine) pruneArtifacts() {
	e.artifacts().Prune(e.cfg.Runs.MaxAge.D())
}
