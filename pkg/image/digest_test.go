package image

import (
	"os"
	"path/filepath"
	"testing"
)

const digestRecipe = `
name: d
description: digest test
packages: [bash, procps]
files:
  - {src: a.txt, dest: /etc/a, mode: 0600}
env: {A: "1", B: "2"}
user: {name: sandbox, uid: 1000}
commands:
  run: [bash, "{file}"]
  extensions: [.sh]
setup: [echo hi]
`

func loadDigestRecipe(t *testing.T, dir, yaml string) *Recipe {
	t.Helper()
	writeFile(t, filepath.Join(dir, "d.yaml"), yaml)
	r, err := LoadRecipe(filepath.Join(dir, "d.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func digestOf(t *testing.T, r *Recipe, suite, mirror string) string {
	t.Helper()
	d, err := recipeDigest(r, suite, mirror)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDigestStable(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.txt"), "content")
	base := digestOf(t, loadDigestRecipe(t, dir, digestRecipe), "s", "file:///m")
	if !isDigest(base) {
		t.Fatalf("digest %q is not 64 hex digits", base)
	}
	// Same recipe written differently: reordered keys and maps, comments,
	// flow style, defaults spelled out.
	same := `# comment
description: digest test
name: d
variant: minbase
setup:
  - echo hi
commands:
  extensions: [.sh]
  run: [bash, "{file}"]
user: {uid: 1000, name: sandbox, gid: 1000, home: /home/sandbox, shell: /bin/sh}
env:
  B: "2"
  A: "1"
files:
  - dest: /etc/a
    src: a.txt
    mode: "600"
packages:
  - bash
  - procps
`
	other := t.TempDir()
	writeFile(t, filepath.Join(other, "files", "d", "a.txt"), "content")
	if got := digestOf(t, loadDigestRecipe(t, other, same), "s", "file:///m"); got != base {
		t.Errorf("the same recipe in another form and place has digest %s, want %s", got, base)
	}
}

func TestDigestChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.txt"), "content")
	base := digestOf(t, loadDigestRecipe(t, dir, digestRecipe), "s", "file:///m")

	mutations := map[string]func(*Recipe){
		"name":        func(r *Recipe) { r.Name = "e" },
		"description": func(r *Recipe) { r.Description = "other" },
		"suite":       func(r *Recipe) { r.Suite = "s" },
		"variant":     func(r *Recipe) { r.Variant = "buildd" },
		"package":     func(r *Recipe) { r.Packages = append(r.Packages, "curl") },
		"order":       func(r *Recipe) { r.Packages[0], r.Packages[1] = r.Packages[1], r.Packages[0] },
		"file dest":   func(r *Recipe) { r.Files[0].Dest = "/etc/b" },
		"file mode":   func(r *Recipe) { r.Files[0].Mode = 0o644 },
		"env":         func(r *Recipe) { r.Env["A"] = "3" },
		"user":        func(r *Recipe) { r.User.UID = 1001 },
		"shell":       func(r *Recipe) { r.User.Shell = "/bin/bash" },
		"command":     func(r *Recipe) { r.Commands["run"] = []string{"sh", "{file}"} },
		"setup":       func(r *Recipe) { r.Setup = append(r.Setup, "true") },
	}
	for name, mutate := range mutations {
		r := loadDigestRecipe(t, dir, digestRecipe)
		mutate(r)
		if got := digestOf(t, r, "s", "file:///m"); got == base {
			t.Errorf("changing %s kept the digest", name)
		}
	}

	r := loadDigestRecipe(t, dir, digestRecipe)
	if digestOf(t, r, "t", "file:///m") == base {
		t.Error("changing the suite kept the digest")
	}
	if digestOf(t, r, "s", "file:///n") == base {
		t.Error("changing the mirror kept the digest")
	}
	writeFile(t, filepath.Join(dir, "a.txt"), "changed")
	if digestOf(t, r, "s", "file:///m") == base {
		t.Error("changing a copied file's content kept the digest")
	}
	if err := os.Remove(filepath.Join(dir, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if _, err := recipeDigest(r, "s", "file:///m"); err == nil {
		t.Error("digest of a recipe whose file is gone succeeded")
	}
}
