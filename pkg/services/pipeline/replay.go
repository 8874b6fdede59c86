package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
)

// Replays is run replay: a recorded run re-run in a fresh sandbox on the
// image digest it first ran on, with its files, arguments, stdin, env and
// limits, recorded as a new run (replayOf) and compared with the original.
// The service implements it; the front ends take it as it is.
type Replays interface {
	ReplayRun(ctx context.Context, req apitypes.RunReplayRequest) (*apitypes.RunReplay, error)
}

var _ Replays = (*Service)(nil)

// maxDiffText is the largest log or output file diffed line by line; a
// larger one that changed is described by its sizes and hashes, as a
// binary file is (a line diff of megabytes helps no one and costs
// quadratic time in the worst case).
const maxDiffText = 1 << 20

// ReplayRun replays run req.RunID. Only plain runs (kind "run") in a
// container replay: an autofix record holds several attempts, an agent
// session a conversation, and a VM run's guest image is not pinned by
// digest.
func (s *Service) ReplayRun(ctx context.Context, req apitypes.RunReplayRequest) (*apitypes.RunReplay, error) {
	rs, err := s.Records()
	if err != nil {
		return nil, err
	}
	// GetRun checks the caller's tenant: another tenant's run is not found.
	orig, err := s.GetRun(ctx, req.RunID, 1)
	if err != nil {
		return nil, err
	}
	md := orig.Metadata
	if md.Kind != "run" {
		return nil, errdefs.FailedPreconditionf("run_id: run %s is a %s record; only run_code runs replay", md.RunID, md.Kind)
	}
	var ci runs.ContainerInfo
	if err := rs.ReadJSON(md.RunID, runs.ContainerInfoJSON, &ci); err != nil {
		return nil, errdefs.FailedPreconditionf("run_id: run %s has no sandbox description to replay on (its sandbox never started)", md.RunID)
	}
	if md.ImageDigest == "" {
		return nil, errdefs.FailedPreconditionf("run_id: run %s recorded no image digest", md.RunID)
	}
	var in runs.Inputs
	note := ""
	switch err := rs.ReadJSON(md.RunID, runs.InputsJSON, &in); {
	case errors.Is(err, fs.ErrNotExist):
		// A record from before inputs were kept: its files and arguments
		// are all there is.
		in = runs.Inputs{Install: true}
		note = "run " + md.RunID + " was recorded before run inputs were kept: replayed without its stdin and env, with the default time limit"
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Internal, err, "read inputs of run %s", md.RunID)
	}
	if in.Backend == BackendVM {
		return nil, errdefs.FailedPreconditionf("run_id: run %s ran in a VM; only container runs replay (a guest image is not pinned by digest)", md.RunID)
	}
	files, err := rs.ReadTree(md.RunID, runs.SnapshotDir, MaxRunFilesBytes)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read code snapshot of run %s", md.RunID)
	}
	creq := RunCodeRequest{Language: md.Language, Entrypoint: md.Entrypoint, Args: md.Args, Stdin: in.Stdin, Env: in.Env,
		Install: &in.Install, Network: ci.Network, Root: in.Root, Files: make(map[string]string, len(files))}
	for name, b := range files {
		creq.Files[name] = string(b)
	}
	if in.TimeoutMS > 0 {
		secs := float64(in.TimeoutMS) / 1000
		creq.TimeoutSeconds = &secs
	}
	if l := ci.Limits; l.MemoryBytes > 0 {
		mem, disk, cpus := l.MemoryBytes>>20, l.DiskBytes>>20, l.CPUs
		creq.MemoryMB = &mem
		if disk > 0 {
			creq.DiskMB = &disk
		}
		if cpus > 0 {
			creq.CPUs = &cpus
		}
	}
	res, err := s.runCode(ctx, creq, nil, &replayPin{of: md.RunID, digest: md.ImageDigest, pids: ci.Limits.Pids})
	if err != nil {
		return nil, err
	}
	diff, err := diffRuns(ctx, rs, md, res)
	if err != nil {
		return nil, err
	}
	return &apitypes.RunReplay{Original: md.RunID, Replay: *res, Diff: *diff, Note: note}, nil
}

// diffRuns compares the original's record with the replay's.
func diffRuns(ctx context.Context, rs *runs.Store, orig runs.Metadata, res *RunResult) (*apitypes.RunDiff, error) {
	d := &apitypes.RunDiff{}
	replayMeta, err := rs.Get(ctx, res.RunID, 1)
	if err != nil {
		return nil, err
	}
	if orig.ExitCode != replayMeta.Metadata.ExitCode {
		d.ExitCode = &apitypes.ExitCodeDiff{Original: orig.ExitCode, Replay: replayMeta.Metadata.ExitCode}
	}
	oOut, oErr, err := rs.Logs(orig.RunID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read logs of run %s", orig.RunID)
	}
	rOut, rErr, err := rs.Logs(res.RunID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read logs of run %s", res.RunID)
	}
	d.Stdout = textDiff("stdout", oOut, rOut)
	d.Stderr = textDiff("stderr", oErr, rErr)
	oFiles, err := rs.ReadTree(orig.RunID, runs.OutputDir, maxRecordOutput)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read output of run %s", orig.RunID)
	}
	rFiles, err := rs.ReadTree(res.RunID, runs.OutputDir, maxRecordOutput)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read output of run %s", res.RunID)
	}
	d.Files = fileDiffs(oFiles, rFiles)
	d.Same = d.ExitCode == nil && d.Stdout == "" && d.Stderr == "" && len(d.Files) == 0
	return d, nil
}

// textDiff is the unified diff of a log, labelled original/NAME and
// replay/NAME; "" when equal. A log that is not text, or too large to diff
// by line, is summed up in one line of sizes and hashes.
func textDiff(name string, a, b []byte) string {
	if bytes.Equal(a, b) {
		return ""
	}
	if !diffable(a) || !diffable(b) {
		return "--- original/" + name + " " + sizeHash(a) + "\n+++ replay/" + name + " " + sizeHash(b) + "\n"
	}
	return udiff.Unified("original/"+name, "replay/"+name, string(a), string(b))
}

func diffable(b []byte) bool {
	return len(b) <= maxDiffText && utf8.Valid(b) && !bytes.ContainsRune(b, 0)
}

func sizeHash(b []byte) string {
	sum := sha256.Sum256(b)
	return "(" + strconv.Itoa(len(b)) + " bytes, sha256 " + hex.EncodeToString(sum[:]) + ")"
}

// fileDiffs lists the output files that differ, in path order.
func fileDiffs(orig, replay map[string][]byte) []apitypes.FileDiff {
	var names []string
	for n := range orig {
		names = append(names, n)
	}
	for n := range replay {
		if _, ok := orig[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var out []apitypes.FileDiff
	for _, n := range names {
		a, inA := orig[n]
		b, inB := replay[n]
		if inA && inB && bytes.Equal(a, b) {
			continue
		}
		fd := apitypes.FileDiff{Path: n, Change: "changed"}
		switch {
		case !inA:
			fd.Change = "added"
		case !inB:
			fd.Change = "removed"
		}
		if inA {
			size, sum := int64(len(a)), sha256.Sum256(a)
			fd.OriginalSize, fd.OriginalSHA256 = &size, hex.EncodeToString(sum[:])
		}
		if inB {
			size, sum := int64(len(b)), sha256.Sum256(b)
			fd.ReplaySize, fd.ReplaySHA256 = &size, hex.EncodeToString(sum[:])
		}
		fd.Binary = inA && !diffable(a) || inB && !diffable(b)
		if !fd.Binary {
			from, to := "original/output/"+n, "replay/output/"+n
			if !inA {
				from = "/dev/null"
			}
			if !inB {
				to = "/dev/null"
			}
			fd.Diff = udiff.Unified(from, to, string(a), string(b))
		}
		out = append(out, fd)
	}
	return out
}
