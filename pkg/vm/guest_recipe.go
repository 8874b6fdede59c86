package vm

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// GuestRecipeFile is the Linux test guest's recipe, relative to the
// recipes directory (a subdirectory, so that it is not a language).
const GuestRecipeFile = "vm/vm-linux.yaml"

// GuestImageName is the image-store name of the guest made for name:
// "linux" is the Linux test guest itself (vm-linux), a language is
// vm-<language>.
func GuestImageName(name string) string { return "vm-" + name }

// GuestRecipe returns the recipe of the guest image for name: "linux" is
// the Linux test guest (GuestRecipeFile under recipesDir); any other name
// is the language recipe lang made into a guest — the test guest's
// packages, files and setup (kernel, qemu-ga, sandbox-init) plus the
// language's packages, environment, commands and dependency managers, so
// that a VM of it runs the language's pipeline like a container of it.
func GuestRecipe(recipesDir, name string, lang *image.Recipe) (*image.Recipe, error) {
	base, err := image.LoadRecipe(filepath.Join(recipesDir, GuestRecipeFile))
	if err != nil {
		return nil, fmt.Errorf("vm guest recipe: %w", err)
	}
	if name == OSLinux {
		return base, nil
	}
	if lang == nil {
		return nil, errdefs.Invalidf("image: no recipe %q to make a guest of", name)
	}
	r := *base
	r.Name = GuestImageName(lang.Name)
	r.Description = lang.Description + " (VM guest)"
	if lang.Suite != "" {
		r.Suite = lang.Suite
	}
	pkgs := slices.Clone(base.Packages)
	for _, p := range lang.Packages {
		if !slices.Contains(pkgs, p) {
			pkgs = append(pkgs, p)
		}
	}
	r.Packages = pkgs
	// Files are resolved against r.Dir (the guest recipe's directory):
	// the guest's own by their files/vm-linux/ path, the language's by a
	// path to the language's recipe directory.
	r.Files = nil
	for _, f := range base.Files {
		f.Src = filepath.Join("files", base.Name, f.Src)
		r.Files = append(r.Files, f)
	}
	for _, f := range lang.Files {
		rel, err := filepath.Rel(base.Dir, filepath.Join(lang.Dir, "files", lang.Name, f.Src))
		if err != nil {
			return nil, err
		}
		f.Src = rel
		r.Files = append(r.Files, f)
	}
	r.Env = maps.Clone(base.Env)
	if r.Env == nil {
		r.Env = map[string]string{}
	}
	maps.Copy(r.Env, lang.Env)
	r.User = lang.User
	r.Commands = lang.Commands
	r.Dependencies = lang.Dependencies
	r.Setup = append(slices.Clone(base.Setup), lang.Setup...)
	return &r, nil
}
