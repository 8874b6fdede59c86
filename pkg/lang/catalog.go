package lang

import (
	"slices"
	"sort"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// Catalog is the set of image recipes the daemon knows and, among them, the
// enabled languages (images.languages in the config; empty enables every
// recipe that is a language). It is read-only after NewCatalog and safe for
// concurrent use.
type Catalog struct {
	recipes map[string]*image.Recipe
	enabled []string
}

// NewCatalog returns the catalogue of recipes, with enabled naming the
// languages to offer (nil or empty: all).
func NewCatalog(recipes map[string]*image.Recipe, enabled []string) *Catalog {
	return &Catalog{recipes: recipes, enabled: enabled}
}

// Recipe returns the recipe of an image, enabled or not.
func (c *Catalog) Recipe(name string) (*image.Recipe, bool) {
	r, ok := c.recipes[name]
	return r, ok
}

// ImageNames lists every recipe's image name, sorted.
func (c *Catalog) ImageNames() []string {
	out := make([]string, 0, len(c.recipes))
	for n := range c.recipes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (c *Catalog) isEnabled(name string) bool {
	return len(c.enabled) == 0 || slices.Contains(c.enabled, name)
}

// Names lists the enabled recipes that are languages, sorted.
func (c *Catalog) Names() []string {
	var out []string
	for name, r := range c.recipes {
		if !c.isEnabled(name) {
			continue
		}
		if _, err := New(r); err == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Handler returns the handler of an enabled language, or an
// invalid_argument error naming field.
func (c *Catalog) Handler(field, name string) (*Handler, *image.Recipe, error) {
	if name == "" {
		return nil, nil, errdefs.Invalidf("%s: required (one of %s)", field, strings.Join(c.Names(), ", "))
	}
	r, ok := c.recipes[name]
	if !ok || !c.isEnabled(name) {
		return nil, nil, errdefs.Invalidf("%s: unknown language %q (known: %s)", field, name, strings.Join(c.Names(), ", "))
	}
	h, err := New(r)
	if err != nil {
		return nil, nil, errdefs.Invalidf("%s: %q is an image, not a language: %v", field, name, err)
	}
	return h, r, nil
}

// ImageVersion is the Debian version of the first of the recipe's packages
// (or, for setup-installed toolchains, of the first package named in a setup
// line) that the built image holds: the language's version as users know it.
func ImageVersion(img *image.Image, r *image.Recipe) string {
	cands := slices.Clone(r.Packages)
	for _, line := range r.Setup {
		if i := strings.Index(line, " install "); i >= 0 {
			for _, f := range strings.Fields(line[i:]) {
				if !strings.HasPrefix(f, "-") && f != "install" {
					cands = append([]string{f}, cands...)
				}
			}
		}
	}
	for _, p := range cands {
		if v, ok := img.Packages[p]; ok {
			return v
		}
	}
	return ""
}
