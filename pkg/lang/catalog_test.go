package lang

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

func TestCatalog(t *testing.T) {
	recipes, err := image.LoadRecipes(filepath.Join("..", "..", "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	all := NewCatalog(recipes, nil)
	if got := all.Names(); !slices.Equal(got, languages) {
		t.Fatalf("Names() = %v, want %v", got, languages)
	}
	h, r, err := all.Handler("language", "python")
	if err != nil || h.Name != "python" || r.Name != "python" {
		t.Fatalf("Handler(python) = %v %v %v", h, r, err)
	}
	only := NewCatalog(recipes, []string{"python", "go"})
	if got := only.Names(); !slices.Equal(got, []string{"go", "python"}) {
		t.Fatalf("enabled Names() = %v", got)
	}
	if _, ok := only.Recipe("rust"); !ok {
		t.Fatal("Recipe must find a recipe whatever is enabled")
	}
	for _, tc := range []struct{ name, want string }{
		{"", "language: required"},
		{"rust", `language: unknown language "rust"`},
		{"cobol", `language: unknown language "cobol"`},
	} {
		_, _, err := only.Handler("language", tc.name)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Handler(%q) = %v, want invalid_argument %q", tc.name, err, tc.want)
		}
	}
}
