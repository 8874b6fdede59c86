package images

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
)

// Dockerfile builds (docs/SPEC.md "Dockerfile builds"): pkg/oci runs the
// Dockerfile; this part checks the request against the daemon's rules
// and lays out the build context.

// Limits of a build request.
const (
	maxContextBytes = 1 << 30
	maxInlineFiles  = 1000
	maxInlineBytes  = 16 << 20
	maxBuildArgs    = 100
)

// Build builds req's Dockerfile with the context read from ctxTar (a tar,
// possibly compressed; nil: req.Files, or no context at all). b runs
// what needs the daemon (the base image, RUN steps).
func (s *Service) Build(ctx context.Context, req apitypes.DockerfileBuildRequest, ctxTar io.Reader, b oci.Builders, progress func(apitypes.BuildProgress)) (*apitypes.Image, error) {
	if req.Tag != "" {
		if oci.IsReference(req.Tag) {
			if _, err := oci.ParseReference("tag", req.Tag); err != nil {
				return nil, err
			}
		} else {
			if err := CheckName("tag", req.Tag); err != nil {
				return nil, err
			}
			if _, ok := s.catalog.Recipe(req.Tag); ok || strings.HasPrefix(req.Tag, oci.NamePrefix) || strings.HasPrefix(req.Tag, oci.IntermediatePrefix) || strings.HasPrefix(req.Tag, VMGuestPrefix) {
				return nil, errdefs.Invalidf("tag: %q is the name of a recipe's image or a reserved prefix (%s, %s, %s)", req.Tag, oci.NamePrefix, oci.IntermediatePrefix, VMGuestPrefix)
			}
		}
	}
	switch req.Network {
	case "", "none", "egress", "allowlist":
	default:
		return nil, errdefs.Invalidf("network: %q: one of none, egress, allowlist", req.Network)
	}
	if len(req.BuildArgs) > maxBuildArgs {
		return nil, errdefs.Invalidf("build_args: %d, at most %d", len(req.BuildArgs), maxBuildArgs)
	}
	for k := range req.BuildArgs {
		if k == "" || strings.ContainsAny(k, "= \t\n\x00") {
			return nil, errdefs.Invalidf("build_args: malformed name %q", k)
		}
	}
	if ctxTar != nil && len(req.Files) > 0 {
		return nil, errdefs.Invalidf("files: give the context as files or as an upload, not both")
	}
	defer s.useLayers()()
	im, err := s.importer(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := im.ContextDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	switch {
	case ctxTar != nil:
		if err := oci.UnpackContext(ctxTar, dir, maxContextBytes); err != nil {
			return nil, err
		}
	case len(req.Files) > 0:
		if err := writeFiles(dir, req.Files); err != nil {
			return nil, err
		}
	}
	if req.Dockerfile == "" && req.DockerfilePath != "" {
		data, err := readContextFile(dir, req.DockerfilePath)
		if err != nil {
			return nil, err
		}
		req.Dockerfile = string(data)
	}
	img, err := im.Build(ctx, oci.BuildRequest{
		Dockerfile: []byte(req.Dockerfile), Context: dir, Tag: req.Tag, BuildArgs: req.BuildArgs,
		Network: req.Network, Allow: req.Allow, NoCache: req.NoCache,
	}, b, progress)
	if err != nil {
		return nil, err
	}
	return s.Described(ctx, img)
}

// writeFiles lays out inline context files below dir, refusing names that
// lead out of it.
func writeFiles(dir string, files map[string]string) error {
	if len(files) > maxInlineFiles {
		return errdefs.Invalidf("files: %d, at most %d", len(files), maxInlineFiles)
	}
	total := 0
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for name, content := range files {
		total += len(content)
		if total > maxInlineBytes {
			return errdefs.Invalidf("files: more than %d bytes", maxInlineBytes)
		}
		clean := path.Clean(name)
		if name == "" || path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "\x00") {
			return errdefs.Invalidf("files: %q: a relative path inside the context is expected", name)
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return errdefs.Invalidf("files: %q: \"..\" leads out of the context", name)
			}
		}
		if d := path.Dir(clean); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return errdefs.Invalidf("files: %q: %v", name, err)
			}
		}
		if err := root.WriteFile(clean, []byte(content), 0o644); err != nil {
			if errors.Is(err, os.ErrExist) {
				return errdefs.Invalidf("files: %q: given twice", name)
			}
			return errdefs.Invalidf("files: %q: %v", name, err)
		}
	}
	return nil
}

// readContextFile reads the Dockerfile named by the request from the
// context (a regular file inside it, at most oci.MaxDockerfile bytes).
func readContextFile(dir, name string) ([]byte, error) {
	clean := path.Clean(name)
	if path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") {
		return nil, errdefs.Invalidf("dockerfile: %q: a path inside the context is expected", name)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fi, err := root.Stat(clean)
	if err != nil {
		return nil, errdefs.Invalidf("dockerfile: %q: not in the context", name)
	}
	if !fi.Mode().IsRegular() || fi.Size() > oci.MaxDockerfile {
		return nil, errdefs.Invalidf("dockerfile: %q: not a regular file of at most %d bytes", name, oci.MaxDockerfile)
	}
	return root.ReadFile(clean)
}

// Image returns the stored image called name.
func (s *Service) Image(name string) (*image.Image, error) { return s.images.Get(name) }
