package engine

import (
	"context"
	"fmt"
	"io"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/images"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/telemetry"
)

// Images are the image service's (pkg/services/images); these methods keep
// the engine the one facade the front ends' narrow interfaces are
// satisfied by, and name the service's parts the engine's own code uses.

// EnsureImage builds the image for recipe name unless an image with the
// recipe's digest exists already.
func (e *Engine) EnsureImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error) {
	ctx, span := telemetry.StartOp(ctx, "image.build", telemetry.KeyImage.String(name))
	im, err := e.imgs.Ensure(ctx, name, log)
	return im, telemetry.End(span, err)
}

// Images lists the built images.
func (e *Engine) Images() ([]apitypes.Image, error) { return e.imgs.List() }

// ImageList lists the built images and the recipes with no built image yet.
func (e *Engine) ImageList(ctx context.Context) (*apitypes.ImageList, error) {
	return e.imgs.Catalog(ctx)
}

// PruneImages removes the stale images no live sandbox runs on.
func (e *Engine) PruneImages(ctx context.Context) ([]apitypes.Image, error) {
	return e.imgs.Prune(ctx)
}

// RemoveImage deletes the built images of recipe name.
func (e *Engine) RemoveImage(ctx context.Context, name string) error {
	return e.imgs.Remove(ctx, name)
}

// PullImage fetches the image ref names from its registry into the store
// (docs/SPEC.md "OCI images"); progress, if not nil, sees each phase.
func (e *Engine) PullImage(ctx context.Context, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error) {
	ctx, span := telemetry.StartOp(ctx, "image.pull", telemetry.KeyImage.String(ref))
	im, err := e.imgs.Pull(ctx, ref, progress)
	return im, telemetry.End(span, err)
}

// ImportImage installs the image of the archive at path (a docker save tar,
// an OCI layout directory or a tar of one); ref picks one of several.
func (e *Engine) ImportImage(ctx context.Context, path, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error) {
	ctx, span := telemetry.StartOp(ctx, "image.import", telemetry.KeyImage.String(ref))
	im, err := e.imgs.Import(ctx, path, ref, progress)
	return im, telemetry.End(span, err)
}

// ImportImageFrom installs the image of an uploaded archive (docker save,
// or a tar of an OCI layout) read from r.
func (e *Engine) ImportImageFrom(ctx context.Context, r io.Reader, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error) {
	ctx, span := telemetry.StartOp(ctx, "image.import", telemetry.KeyImage.String(ref))
	im, err := e.imgs.ImportFrom(ctx, r, ref, progress)
	return im, telemetry.End(span, err)
}

// progressLines turns pull progress into the phase lines of a create.
func progressLines(progress func(string)) oci.Progress {
	if progress == nil {
		return nil
	}
	return func(p apitypes.ImageProgress) {
		switch p.Phase {
		case "resolved":
			progress(fmt.Sprintf("image %s: pulling %d layers (%s)", p.Image, p.Layers, p.Digest))
		case "layer":
			progress(fmt.Sprintf("image %s: layer %d/%d %s (%d bytes%s)", p.Image, p.Index+1, p.Layers, p.Layer, p.Bytes, map[bool]string{true: ", stored already"}[p.Cached]))
		case "done":
			progress(fmt.Sprintf("image %s: ready", p.Image))
		}
	}
}

func (e *Engine) imageKnown(name string) bool { return e.imgs.Known(name) }

func (e *Engine) knownImages() []string { return e.imgs.KnownNames() }

func (e *Engine) pruneStaleImages(ctx context.Context) { e.imgs.PruneStale(ctx) }

func (e *Engine) ensureImageOnDemand(ctx context.Context, name string) error {
	ctx, span := telemetry.Start(ctx, "image.build", telemetry.KeyImage.String(name), attribute.Bool("sandboxd.on_demand", true))
	return telemetry.End(span, e.imgs.EnsureOnDemand(ctx, name))
}

func (e *Engine) describedImage(ctx context.Context, img *image.Image) (*apitypes.Image, error) {
	return e.imgs.Described(ctx, img)
}

func (e *Engine) vmRecipe(field, name string) (*image.Recipe, error) {
	return e.imgs.VMRecipe(field, name)
}

func checkImageName(field, name string) error { return images.CheckName(field, name) }

// LanguageInfo is one entry of languages_list.
type LanguageInfo = apitypes.LanguageInfo

// Languages lists the enabled languages. An image is ready when it is
// built from the current recipe; the version is that of the recipe's first
// package in the built image (empty until it is built).
func (e *Engine) Languages(ctx context.Context) ([]LanguageInfo, error) {
	b := &image.Builder{Store: e.images, Mirror: e.cfg.Images.Mirror, Suite: e.cfg.Images.Suite}
	var out []LanguageInfo
	for _, name := range e.catalog.Names() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, _ := e.catalog.Recipe(name)
		h, err := lang.New(r)
		if err != nil {
			continue
		}
		li := LanguageInfo{Name: name, Image: name, Extensions: h.Extensions, Entrypoint: h.Entrypoint,
			Tasks: h.TaskNames(), Managers: h.Managers(), Compiled: h.Compiled(), Description: r.Description}
		if li.Tasks == nil {
			li.Tasks = []string{}
		}
		if img, err := e.images.Get(name); err == nil {
			if want, err := b.Digest(r); err == nil && want == img.Digest {
				li.ImageReady = true
			}
			li.Version = lang.ImageVersion(img, r)
		}
		out = append(out, li)
	}
	return out, nil
}
