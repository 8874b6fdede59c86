package images

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// noSandboxes is a sandbox service with no live sandbox.
type noSandboxes struct{}

func (noSandboxes) List(context.Context, ...sandbox.State) ([]*sandbox.Info, error) { return nil, nil }

// newService is the image service over the repository's recipes and an
// empty image store: what it answers without building runs as any user.
func newService(t testing.TB) *Service {
	t.Helper()
	recipesDir, err := filepath.Abs("../../../rootfs")
	if err != nil {
		t.Fatal(err)
	}
	recipes, err := image.LoadRecipes(recipesDir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := image.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return New(Options{Store: st, Catalog: lang.NewCatalog(recipes, nil), Config: &config.Images{}, RecipesDir: recipesDir,
		Sandboxes: noSandboxes{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func TestRefusesHostileNames(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	for _, name := range []string{"", "../shell", "a/b", "x\x00y", strings.Repeat("a", 64), "Shell"} {
		if _, err := s.Ensure(ctx, name, io.Discard); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "name:") {
			t.Errorf("ensure %q: %v, want invalid_argument naming name", name, err)
		}
		if err := s.Remove(ctx, name); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "name:") {
			t.Errorf("remove %q: %v, want invalid_argument naming name", name, err)
		}
	}
	if _, err := s.Ensure(ctx, "nosuchrecipe", io.Discard); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), `no recipe "nosuchrecipe"`) {
		t.Errorf("ensure of an unknown recipe: %v", err)
	}
	if err := s.Remove(ctx, "shell"); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("remove of an unbuilt image: %v", err)
	}
	if _, err := s.VMRecipe("image", "nosuchlanguage"); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "image:") {
		t.Errorf("VM recipe of an unknown language: %v", err)
	}
}

func TestCatalogWithNothingBuilt(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if !s.Known("shell") || s.Known("nosuchrecipe") {
		t.Fatal("Known: shell has a recipe, nosuchrecipe none")
	}
	if names := s.KnownNames(); !slices.Contains(names, "shell") || !slices.IsSorted(names) {
		t.Fatalf("KnownNames %v: want shell among sorted names", names)
	}
	list, err := s.Catalog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Images) != 0 {
		t.Fatalf("built images %+v in an empty store", list.Images)
	}
	var shell, guest bool
	for _, r := range list.Unbuilt {
		shell = shell || r.Name == "shell" && !r.VM
		guest = guest || r.Name == "linux" && r.VM
	}
	if !shell || !guest {
		t.Fatalf("unbuilt %+v: want the shell recipe and the linux guest", list.Unbuilt)
	}
	// Build on demand is off: the request is left to fail where it would.
	if err := s.EnsureOnDemand(ctx, "shell"); err != nil {
		t.Fatalf("on demand with build_on_demand off: %v", err)
	}
	if pruned, err := s.Prune(ctx); err != nil || len(pruned) != 0 {
		t.Fatalf("prune of an empty store: %+v, %v", pruned, err)
	}
}
