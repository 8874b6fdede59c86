package engine

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Dockerfile builds (docs/SPEC.md "Dockerfile builds"): the image service
// and pkg/oci run the Dockerfile; the engine gives them its images and
// runs each RUN step in a root-mode sandbox of its own, made the way
// sandbox_create makes one (limits, seccomp, network policy), so that a
// build step has no more power than a sandbox.

// BuildLabel marks the sandboxes of RUN steps.
const BuildLabel = "sandboxd.build-step"

// BuildDockerfile builds req's Dockerfile; ctxTar, if not nil, is the
// build context as a tar (REST upload), else req.Files is.
func (e *Engine) BuildDockerfile(ctx context.Context, req apitypes.DockerfileBuildRequest, ctxTar io.Reader, progress func(apitypes.BuildProgress)) (*apitypes.Image, error) {
	return e.imgs.Build(ctx, req, ctxTar, oci.Builders{Base: e.buildBase, Run: e.buildRun}, progress)
}

// buildBase is the image a FROM names: a reference as sandbox_create
// resolves it (pulled when images.allow_pull allows), a language image
// built on first use.
func (e *Engine) buildBase(ctx context.Context, name string) (*image.Image, error) {
	if oci.IsReference(name) {
		n, err := e.imgs.Resolve(ctx, "FROM", name, nil)
		if err != nil {
			return nil, err
		}
		name = n
	} else if !e.imageKnown(name) {
		return nil, errdefs.Invalidf("FROM: no image %q (known: %s)", name, strings.Join(e.knownImages(), ", "))
	}
	if strings.HasPrefix(name, oci.IntermediatePrefix) {
		return nil, errdefs.Invalidf("FROM: %q is a build's intermediate image", name)
	}
	if err := e.ensureImageOnDemand(ctx, name); err != nil {
		return nil, err
	}
	img, err := e.imgs.Image(name)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.NotFound, err, "FROM: image %s", name)
	}
	return img, nil
}

// buildRun runs one RUN step in a fresh root-mode sandbox of its
// intermediate image (as root, or as the step's USER with root mode's
// writable root kept: RootAsUser), writes the layer of what it changed in the root
// file system, and terminates the sandbox.
func (e *Engine) buildRun(ctx context.Context, step oci.RunStep, layer io.Writer) (err error) {
	info, err := e.CreateSandbox(ctx, CreateSandboxRequest{
		Image: step.Image, Root: true, RootAsUser: !step.Root, Network: step.Network, Allow: step.Allow,
		Labels: map[string]string{BuildLabel: step.Image},
	})
	if err != nil {
		return err
	}
	defer func() {
		if _, terr := e.TerminateSandbox(context.WithoutCancel(ctx), info.ID); terr != nil && err == nil {
			err = terr
		}
	}()
	var tail strings.Builder
	res, err := e.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: step.Argv, Env: step.Env, Cwd: step.Cwd}, func(stream string, data []byte) {
		if step.Output != nil {
			step.Output(stream, string(data))
		}
		if stream == "stderr" && tail.Len() < 4096 {
			tail.Write(data)
		}
	})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(tail.String())
		if len(msg) > 1000 {
			msg = msg[len(msg)-1000:]
		}
		return errdefs.Invalidf("the command exited with %d: %s", res.ExitCode, msg)
	}
	return e.sandboxes.Frozen(ctx, info.ID, func(d sandbox.WritableDirs) error {
		if d.Upper == "" {
			return fmt.Errorf("sandbox %s: no writable layer to read", info.ID)
		}
		return oci.WriteUpperLayer(d.Upper, d.DaemonFiles, d.IDBase, d.IDSize, layer)
	})
}
