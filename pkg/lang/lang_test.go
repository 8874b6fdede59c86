package lang

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// The ten languages of issue 4; each must have a recipe that is a language.
var languages = []string{"agent", "c", "cpp", "csharp", "go", "java", "javascript", "python", "rust", "shell", "typescript"}

func TestRecipesAreLanguages(t *testing.T) {
	recipes, err := image.LoadRecipes(filepath.Join("..", "..", "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range languages {
		r := recipes[name]
		if r == nil {
			t.Errorf("no recipe %s", name)
			continue
		}
		h, err := New(r)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !h.IsSource(h.Entrypoint) {
			t.Errorf("%s: entrypoint %q lacks one of %v", name, h.Entrypoint, h.Extensions)
		}
		if r.User.UID != 1000 || r.User.Name != "sandbox" {
			t.Errorf("%s: user %+v", name, r.User)
		}
		for _, p := range []string{"git", "ca-certificates"} {
			if !slices.Contains(r.Packages, p) {
				t.Errorf("%s: package %s missing", name, p)
			}
		}
		if name != "shell" && len(h.TaskNames()) == 0 {
			t.Errorf("%s: no tasks", name)
		}
	}
}

func TestExpand(t *testing.T) {
	got := Expand([]string{"x", "{file}", "-o{out}/{main}", "{files}", "{args}", "{path}", "{packages}"},
		Vars{File: "src/Main.java", Files: []string{"a", "b"}, Out: "/tmp/o", Args: []string{"1", ""}, Packages: []string{"p"}})
	want := []string{"x", "src/Main.java", "-o/tmp/o/Main", "a", "b", "1", "", ".", "p"}
	if !slices.Equal(got, want) {
		t.Fatalf("Expand = %q, want %q", got, want)
	}
}

func TestMainFile(t *testing.T) {
	h := &Handler{Name: "python", Extensions: []string{".py"}, Entrypoint: "main.py", Run: []string{"python3"}}
	tests := []struct {
		files    []string
		explicit string
		want     string
		err      bool
	}{
		{files: []string{"main.py", "mod.py"}, want: "main.py"},
		{files: []string{"app.py", "README"}, want: "app.py"},
		{files: []string{"pkg/app.py"}, want: "pkg/app.py"},
		{files: []string{"a.py", "b.py"}, err: true},
		{files: []string{"a.py", "b.py"}, explicit: "b.py", want: "b.py"},
		{files: []string{"a.py"}, explicit: "c.py", err: true},
		{files: []string{"README"}, err: true},
	}
	for _, tt := range tests {
		got, err := h.MainFile(tt.files, tt.explicit)
		if tt.err {
			if !errors.Is(err, ErrNoEntrypoint) {
				t.Errorf("MainFile(%v, %q) = %q, %v; want ErrNoEntrypoint", tt.files, tt.explicit, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("MainFile(%v, %q) = %q, %v; want %q", tt.files, tt.explicit, got, err, tt.want)
		}
	}
}

func TestFileNameFor(t *testing.T) {
	h := &Handler{Extensions: []string{".java"}, Entrypoint: "Main.java"}
	if got := h.FileNameFor("import x;\npublic final class Hello {\n}"); got != "Hello.java" {
		t.Errorf("FileNameFor = %q", got)
	}
	if got := h.FileNameFor("class Foo {}"); got != "Main.java" {
		t.Errorf("FileNameFor = %q", got)
	}
}

func TestInstallsAndNetwork(t *testing.T) {
	d := image.Dependency{Manager: "pip", Manifest: "requirements.txt", Install: []string{"pip"}, OfflineErrors: []string{"No matching distribution"}}
	h := &Handler{Dependencies: []image.Dependency{d}}
	if got := h.Installs([]string{"main.py"}); len(got) != 0 {
		t.Errorf("Installs without manifest = %v", got)
	}
	if got := h.Installs([]string{"requirements.txt"}); len(got) != 1 {
		t.Errorf("Installs = %v", got)
	}
	if !NeededNetwork(d, "ERROR: No matching distribution found for requests") || NeededNetwork(d, "SyntaxError") {
		t.Error("NeededNetwork misjudges")
	}
}
