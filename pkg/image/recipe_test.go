package image

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestLoadRecipeDefaults(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "files", "py", "sitecustomize.py"), "import sys\n")
	writeFile(t, filepath.Join(dir, "py.yaml"), `
name: py
packages: [python3]
files:
  - src: sitecustomize.py
    dest: /usr/lib/python3/dist-packages/sitecustomize.py
commands:
  run: [python3, "{file}"]
`)
	r, err := LoadRecipe(filepath.Join(dir, "py.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := UserSpec{Name: "sandbox", UID: 1000, GID: 1000, Home: "/home/sandbox", Shell: "/bin/sh"}
	if r.Variant != "minbase" || r.User != want || r.Files[0].Mode != 0o644 || r.Dir != dir {
		t.Errorf("defaults: variant %q user %+v mode %s dir %q", r.Variant, r.User, r.Files[0].Mode, r.Dir)
	}
	if !reflect.DeepEqual(r.Commands["run"], []string{"python3", "{file}"}) {
		t.Errorf("commands: %v", r.Commands)
	}
}

func TestLoadRecipeErrorsNameFields(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown key", "name: bad\npackage: [bash]\n", []string{"field package not found"}},
		{"unknown nested key", "name: bad\nuser: {nme: x}\n", []string{"field nme not found"}},
		{"wrong type", "name: bad\npackages: bash\n", []string{"line 2", "cannot unmarshal"}},
		{"command not a list", "name: bad\ncommands: {run: python3}\n", []string{"line 2", "cannot unmarshal"}},
		{"two documents", "name: bad\n---\nname: other\n", []string{"exactly one YAML document"}},
		{"empty", "", []string{"empty recipe"}},
		{"name mismatch", "name: other\n", []string{`name: "other" must match the file name "bad"`}},
		{"variant", "name: bad\nvariant: custom\n", []string{`variant: "custom"`}},
		{"suite", "name: bad\nsuite: Book/Worm\n", []string{"suite:"}},
		{"package", "name: bad\npackages: [bash, 'x,y', bash]\n", []string{`packages[1]: "x,y"`, `packages[2]: "bash" is listed twice`}},
		{"file src missing", "name: bad\nfiles: [{src: nope, dest: /x}]\n", []string{"files[0].src:", "nope"}},
		{"file src escapes", "name: bad\nfiles: [{src: ../etc/passwd, dest: /x}]\n", []string{"files[0].src:", "relative path inside"}},
		{"file dest", "name: bad\nfiles: [{src: ok.txt, dest: etc/x}, {src: ok.txt, dest: /a/../b}]\n", []string{"files[0].dest:", "files[1].dest:"}},
		{"file dest twice", "name: bad\nfiles: [{src: ok.txt, dest: /x}, {src: ok.txt, dest: /x}]\n", []string{`files[1].dest: "/x" is written twice`}},
		{"file mode", "name: bad\nfiles: [{src: ok.txt, dest: /x, mode: 0999}]\n", []string{"mode", "octal"}},
		{"env", "name: bad\nenv: {1X: a, OK: b}\n", []string{"env.1X:"}},
		{"user", "name: bad\nuser: {name: Root!, uid: 65534, home: home}\n", []string{"user.name:", "user.uid: 65534", "user.home:"}},
		{"commands", "name: bad\ncommands: {Run: [x], test: []}\n", []string{"commands.Run:", "commands.test:"}},
		{"setup", "name: bad\nsetup: ['  ']\n", []string{"setup[0]: empty line"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "ok.txt"), "ok")
			file := filepath.Join(dir, "bad.yaml")
			writeFile(t, file, tt.yaml)
			_, err := LoadRecipe(file)
			if err == nil {
				t.Fatal("LoadRecipe succeeded")
			}
			if errdefs.CodeOf(err) != errdefs.InvalidArgument {
				t.Errorf("code %s, want invalid_argument", errdefs.CodeOf(err))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadRecipes(t *testing.T) {
	recipes, err := LoadRecipes(filepath.Join("..", "..", "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	shell := recipes["shell"]
	if shell == nil || shell.User.Name != "sandbox" || shell.User.UID != 1000 || shell.User.Home != "/home/sandbox" {
		t.Fatalf("rootfs/shell.yaml: %+v", shell)
	}

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "name: a\n")
	writeFile(t, filepath.Join(dir, "b.yaml"), "name: b\nvariant: nope\n")
	writeFile(t, filepath.Join(dir, "c.yaml"), "name: c\nfoo: 1\n")
	_, err = LoadRecipes(dir)
	if err == nil || !strings.Contains(err.Error(), "b.yaml") || !strings.Contains(err.Error(), "c.yaml") {
		t.Fatalf("LoadRecipes with two bad recipes: %v", err)
	}
}

// TestPythonRecipesWriteNoBytecode: CPython decides a cached .pyc is fresh
// by the source's mtime in whole seconds and its size, so an edit of the same
// size within the second of the last run (an agent's "a - b" to "a + b") runs
// the old code. Every image that installs Python turns the cache off; the
// engine's TestPythonSeesASameSecondEdit shows it in a sandbox.
func TestPythonRecipesWriteNoBytecode(t *testing.T) {
	recipes, err := LoadRecipes(filepath.Join("..", "..", "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for name, r := range recipes {
		if !slices.ContainsFunc(r.Packages, func(p string) bool { return strings.HasPrefix(p, "python3") }) {
			continue
		}
		checked++
		if r.Env["PYTHONDONTWRITEBYTECODE"] != "1" {
			t.Errorf("rootfs/%s.yaml installs Python but does not set PYTHONDONTWRITEBYTECODE=1", name)
		}
	}
	if checked < 3 {
		t.Fatalf("only %d recipes install Python; python, agent and base do", checked)
	}
}

func TestFileModeNotation(t *testing.T) {
	for in, want := range map[string]FileMode{"0755": 0o755, "755": 0o755, "0o4755": 0o4755, "0": 0} {
		got, err := parseOctalMode(in)
		if err != nil || got != want {
			t.Errorf("parseOctalMode(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"8", "rwx", "017777", "-1"} {
		if _, err := parseOctalMode(in); err == nil {
			t.Errorf("parseOctalMode(%q) succeeded", in)
		}
	}
}
