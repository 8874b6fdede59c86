package engine

import (
	"context"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// Images as clients manage them (image_list/build/delete, /v1/images,
// sandboxctl images): which recipe builds each image and whether it is up to
// date, and what could still be built.

// vmGuestPrefix starts the name of a VM guest image (vm.GuestImageName).
var vmGuestPrefix = vm.GuestImageName("")

// checkImageName refuses an image or recipe name that cannot name one
// before it reaches the image store's paths ("/", NUL, too long).
func checkImageName(field, name string) error {
	switch {
	case name == "":
		return errdefs.Invalidf("%s: required", field)
	case len(name) > 63:
		return errdefs.Invalidf("%s: malformed image name: %d bytes, at most 63", field, len(name))
	case !image.ValidName(name):
		return errdefs.Invalidf("%s: malformed image name %q: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter", field, name)
	}
	return nil
}

// imageRecipe returns the recipe that builds the image called name, the
// name image builds take for it and whether that is a VM guest build; nil
// when no recipe builds it.
func (e *Engine) imageRecipe(name string) (r *image.Recipe, build string, guest bool) {
	if r, ok := e.catalog.Recipe(name); ok {
		return r, name, false
	}
	if n, ok := strings.CutPrefix(name, vmGuestPrefix); ok && n != "" {
		if r, err := e.vmRecipe("name", n); err == nil {
			return r, n, true
		}
	}
	return nil, "", false
}

// describedImage is img as clients see it (describeImage), among the
// live sandboxes now.
func (e *Engine) describedImage(ctx context.Context, img *image.Image) (*apitypes.Image, error) {
	live, err := e.sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	pub := publicImage(img)
	e.describeImage(&pub, live)
	return &pub, nil
}

// describeImage fills in an image's users among the live sandboxes, its
// recipe and whether it is up to date.
func (e *Engine) describeImage(im *apitypes.Image, live []*sandbox.Info) {
	for _, sb := range live {
		// A sandbox that does not record its digest (a VM: its guest
		// disk is made from the current image) counts as a user, as
		// RemoveImage counts it.
		if sb.Image == im.Name && (sb.ImageDigest == im.Digest || sb.ImageDigest == "") {
			im.Users = append(im.Users, sb.ID)
		}
	}
	im.InUse = len(im.Users)
	r, build, guest := e.imageRecipe(im.Name)
	if r == nil {
		return
	}
	im.Recipe, im.VM = build, guest
	b := &image.Builder{Store: e.images, Mirror: e.cfg.Images.Mirror, Suite: e.cfg.Images.Suite}
	if want, err := b.Digest(r); err == nil {
		up := want == im.Digest
		im.UpToDate = &up
	}
}

// ImageList lists the built images (Images) and the recipes with no built
// image yet: every recipe's container image and every VM guest image
// (linux and each enabled language).
func (e *Engine) ImageList(ctx context.Context) (*apitypes.ImageList, error) {
	imgs, err := e.Images()
	if err != nil {
		return nil, err
	}
	built := map[string]bool{}
	for _, im := range imgs {
		built[im.Name] = true
	}
	languages := map[string]bool{}
	for _, n := range e.catalog.Names() {
		languages[n] = true
	}
	out := &apitypes.ImageList{Images: imgs, Unbuilt: []apitypes.ImageRecipe{}}
	if out.Images == nil {
		out.Images = []apitypes.Image{}
	}
	for _, n := range e.catalog.ImageNames() {
		if built[n] {
			continue
		}
		r, _ := e.catalog.Recipe(n)
		out.Unbuilt = append(out.Unbuilt, apitypes.ImageRecipe{Name: n, Language: languages[n], Description: r.Description})
	}
	for _, n := range append([]string{vm.OSLinux}, e.catalog.Names()...) {
		if built[vm.GuestImageName(n)] {
			continue
		}
		ir := apitypes.ImageRecipe{Name: n, VM: true, Language: languages[n], Description: "VM guest image " + vm.GuestImageName(n)}
		if n == vm.OSLinux {
			ir.Description += ": the Linux test guest (a minimal Debian with python3)"
		}
		out.Unbuilt = append(out.Unbuilt, ir)
	}
	return out, ctx.Err()
}
