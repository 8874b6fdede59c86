// Package images is the image service: images as clients manage them
// (image_list/build/delete, /v1/images, sandboxctl images), which recipe
// builds each image and whether it is up to date, what could still be
// built, pruning, and images built on first use (ondemand.go). It needs of
// the sandbox service only the live sandboxes (Sandboxes); pkg/engine
// composes it.
package images

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// Sandboxes is what the image service needs of the sandbox service: the
// live sandboxes, which an image in use has as users.
type Sandboxes interface {
	List(ctx context.Context, states ...sandbox.State) ([]*sandbox.Info, error)
}

// Options are what New needs.
type Options struct {
	Store   *image.Store
	Catalog *lang.Catalog
	// Config is the daemon's images section, shared (not copied): the
	// service reads it at each use, as the rest of the engine does.
	Config     *config.Images
	RecipesDir string // VM guest recipes (vm.GuestRecipe)
	Sandboxes  Sandboxes
	Log        *slog.Logger
	// OnBuild, if set, sees each build on first use start ("started") and
	// end ("built", "failed"): the engine's metrics.
	OnBuild func(name, outcome string)
	// MaxID is the size of a sandbox's id range (sandbox.userns_pool.size):
	// OCI image files owned beyond it are refused.
	MaxID int
	// Resolver looks registry hosts up for the pulls of non-admin keys
	// (oci.Egress); nil: the system's resolver. Tests point names at
	// loopback registries with it.
	Resolver oci.Resolver
}

// Service builds, describes, lists, prunes and removes images.
type Service struct {
	images    *image.Store
	catalog   *lang.Catalog
	cfg       *config.Images
	recipes   string
	sandboxes Sandboxes
	log       *slog.Logger
	onBuild   func(name, outcome string)
	builds    imageBuilds // images being built on first use (ondemand.go)
	pulls     pulls       // OCI images being pulled (oci.go)
	layerUse  layerUse    // pulls, imports and builds in flight (gc.go)
	maxID     int
	resolver  oci.Resolver
}

// New returns the image service.
func New(o Options) *Service {
	on := o.OnBuild
	if on == nil {
		on = func(string, string) {}
	}
	return &Service{images: o.Store, catalog: o.Catalog, cfg: o.Config, recipes: o.RecipesDir, sandboxes: o.Sandboxes, log: o.Log, onBuild: on, maxID: o.MaxID, resolver: o.Resolver}
}

// VMGuestPrefix starts the name of a VM guest image (vm.GuestImageName).
var VMGuestPrefix = vm.GuestImageName("")

// CheckName refuses an image or recipe name that cannot name one
// before it reaches the image store's paths ("/", NUL, too long).
func CheckName(field, name string) error {
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
func (s *Service) imageRecipe(name string) (r *image.Recipe, build string, guest bool) {
	if r, ok := s.catalog.Recipe(name); ok {
		return r, name, false
	}
	if n, ok := strings.CutPrefix(name, VMGuestPrefix); ok && n != "" {
		if r, err := s.VMRecipe("name", n); err == nil {
			return r, n, true
		}
	}
	return nil, "", false
}

// Described is img as clients see it (Describe), among the
// live sandboxes now.
func (s *Service) Described(ctx context.Context, img *image.Image) (*apitypes.Image, error) {
	live, err := s.sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	pub := Public(img)
	s.Describe(&pub, live)
	return &pub, nil
}

// Describe fills in an image's users among the live sandboxes, its
// recipe and whether it is up to date.
func (s *Service) Describe(im *apitypes.Image, live []*sandbox.Info) {
	for _, sb := range live {
		// A sandbox that does not record its digest (a VM: its guest
		// disk is made from the current image) counts as a user, as
		// RemoveImage counts it.
		if sb.Image == im.Name && (sb.ImageDigest == im.Digest || sb.ImageDigest == "") {
			im.Users = append(im.Users, sb.ID)
		}
	}
	im.InUse = len(im.Users)
	r, build, guest := s.imageRecipe(im.Name)
	if r == nil {
		return
	}
	im.Recipe, im.VM = build, guest
	b := &image.Builder{Store: s.images, Mirror: s.cfg.Mirror, Suite: s.cfg.Suite}
	if want, err := b.Digest(r); err == nil {
		up := want == im.Digest
		im.UpToDate = &up
	}
}

// Catalog lists the built images (List) and the recipes with no built
// image yet: every recipe's container image and every VM guest image
// (linux and each enabled language).
func (s *Service) Catalog(ctx context.Context) (*apitypes.ImageList, error) {
	imgs, err := s.List()
	if err != nil {
		return nil, err
	}
	built := map[string]bool{}
	for _, im := range imgs {
		built[im.Name] = true
	}
	languages := map[string]bool{}
	for _, n := range s.catalog.Names() {
		languages[n] = true
	}
	out := &apitypes.ImageList{Images: imgs, Unbuilt: []apitypes.ImageRecipe{}}
	if out.Images == nil {
		out.Images = []apitypes.Image{}
	}
	for _, n := range s.catalog.ImageNames() {
		if built[n] {
			continue
		}
		r, _ := s.catalog.Recipe(n)
		out.Unbuilt = append(out.Unbuilt, apitypes.ImageRecipe{Name: n, Language: languages[n], Description: r.Description})
	}
	for _, n := range append([]string{vm.OSLinux}, s.catalog.Names()...) {
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

// Known reports whether name is an image a recipe builds or one that is built.
func (s *Service) Known(name string) bool {
	if _, ok := s.catalog.Recipe(name); ok {
		return true
	}
	_, err := s.images.Get(name)
	return err == nil
}

// KnownNames lists the images recipes build and the built ones, sorted.
func (s *Service) KnownNames() []string {
	seen := map[string]bool{}
	for _, n := range s.catalog.ImageNames() {
		seen[n] = true
	}
	if imgs, err := s.images.List(); err == nil {
		for _, i := range imgs {
			seen[i.Name] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Ensure builds the image for recipe name unless an image with the
// recipe's digest exists already.
func (s *Service) Ensure(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error) {
	if err := CheckName("name", name); err != nil {
		return nil, err
	}
	r, ok := s.catalog.Recipe(name)
	if !ok {
		hint := ""
		if strings.HasPrefix(name, VMGuestPrefix) {
			hint = "; a VM guest image " + name + " is built as a guest (vm) of " + strings.TrimPrefix(name, VMGuestPrefix)
		}
		return nil, errdefs.Invalidf("name: no recipe %q (known: %s)%s", name, strings.Join(s.catalog.ImageNames(), ", "), hint)
	}
	b := &image.Builder{Store: s.images, Mirror: s.cfg.Mirror, Suite: s.cfg.Suite, Log: log}
	img, err := b.Ensure(ctx, r)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "build image %s", name)
	}
	return s.Described(ctx, img)
}

// List lists the built images.
func (s *Service) List() ([]apitypes.Image, error) {
	imgs, err := s.images.List()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list images")
	}
	live, err := s.sandboxes.List(context.Background())
	if err != nil {
		return nil, err
	}
	out := make([]apitypes.Image, len(imgs))
	for i, im := range imgs {
		out[i] = Public(im)
		s.Describe(&out[i], live)
	}
	return out, nil
}

// Public is what clients see of a built image: no host paths.
func Public(im *image.Image) apitypes.Image {
	out := apitypes.Image{Name: im.Name, Digest: im.Digest, BuiltAt: im.BuiltAt, SizeBytes: im.SizeBytes,
		BuildSeconds: im.BuildSeconds, Suite: im.Suite, Packages: len(im.Packages)}
	if o := im.OCI; o != nil {
		out.OCI = &apitypes.ImageOCI{
			References: o.References, ManifestDigest: o.ManifestDigest, ConfigDigest: o.ConfigDigest,
			Layers: o.Layers, WorkingDir: o.WorkingDir, User: im.User.Name, UID: im.User.UID,
			Entrypoint: o.Entrypoint, Cmd: o.Cmd, Labels: o.Labels,
		}
	}
	return out
}

// Prune removes the stale images — trees of an older digest of a
// recipe, no longer current — that no live sandbox of this daemon runs on,
// and returns them; then what crashed pulls and builds left
// (RemoveDebris) and the layers no image uses (CollectLayers).
func (s *Service) Prune(ctx context.Context) ([]apitypes.Image, error) {
	stale, err := s.images.Stale()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list stale images")
	}
	live, err := s.sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, sb := range live {
		used[sb.ImageDigest] = true
	}
	out := []apitypes.Image{}
	var errs []error
	for _, im := range stale {
		if used[im.Digest] {
			continue
		}
		if err := s.images.RemoveDigest(im.Name, im.Digest); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, Public(im))
	}
	if err := errors.Join(errs...); err != nil {
		return out, errdefs.Wrap(errdefs.Internal, err, "prune images")
	}
	// What crashes left: it is no image, so prune is where it goes.
	if debris, err := s.RemoveDebris(); err != nil {
		return out, errdefs.Wrap(errdefs.Internal, err, "remove what interrupted pulls and builds left")
	} else if len(debris) > 0 {
		s.log.Info("removed what interrupted pulls and builds left", "entries", debris)
	}
	// The layers only the removed images (or images deleted before) used.
	if layers, freed, err := s.CollectLayers(); err != nil {
		return out, errdefs.Wrap(errdefs.Internal, err, "collect unused layers")
	} else if len(layers) > 0 {
		s.log.Info("removed unused layers", "layers", len(layers), "bytes", freed)
	}
	return out, nil
}

// PruneStale applies images.prune_stale.
func (s *Service) PruneStale(ctx context.Context) {
	if !s.cfg.PruneStale {
		return
	}
	removed, err := s.Prune(ctx)
	for _, im := range removed {
		s.log.Info("pruned stale image", "image", im.Name, "digest", im.Digest)
	}
	if err != nil {
		s.log.Warn("prune stale images", "err", err)
	}
}

// Remove deletes the built images of recipe name. An image in use by a
// live sandbox is refused: it is the lower layer of that sandbox's root.
func (s *Service) Remove(ctx context.Context, name string) error {
	if err := CheckName("name", name); err != nil {
		return err
	}
	if _, err := s.images.Get(name); errors.Is(err, image.ErrNotFound) {
		return errdefs.NotFoundf("name: no built image %q", name)
	}
	live, err := s.sandboxes.List(ctx)
	if err != nil {
		return err
	}
	for _, sb := range live {
		if sb.Image == name {
			return errdefs.Conflictf("image %s is in use by sandbox %s", name, sb.ID)
		}
	}
	if err := s.images.Remove(name); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "remove image %s", name)
	}
	return nil
}

// VMRecipe is the recipe of the guest image of name (linux or a language);
// an unknown name is an invalid_argument naming field.
func (s *Service) VMRecipe(field, name string) (*image.Recipe, error) {
	if name == vm.OSLinux {
		return vm.GuestRecipe(s.recipes, name, nil)
	}
	r, ok := s.catalog.Recipe(name)
	if !ok {
		return nil, errdefs.Invalidf("%s: no guest image %q: linux or a language (known: %s)", field, name, strings.Join(s.catalog.Names(), ", "))
	}
	return vm.GuestRecipe(s.recipes, name, r)
}
