package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Recipe describes one language image: what mmdebstrap installs and what is
// put on top of it. It is read from rootfs/<name>.yaml.
type Recipe struct {
	// Name identifies the image; it must equal the recipe's file name
	// without ".yaml".
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description" json:"description"`
	// Suite is the Debian suite; empty means the builder's default.
	Suite string `yaml:"suite" json:"suite,omitempty"`
	// Variant is the mmdebstrap variant (default minbase).
	Variant  string   `yaml:"variant" json:"variant"`
	Packages []string `yaml:"packages" json:"packages"`
	// Files are copied into the image after the packages are installed.
	Files []FileSpec `yaml:"files" json:"files"`
	// Env is baked into the image's metadata and applied to every command
	// run in it (and to the setup lines).
	Env  map[string]string `yaml:"env" json:"env"`
	User UserSpec          `yaml:"user" json:"user"`
	// Commands are the language's commands by purpose (version, run,
	// compile, lint, test, extensions, ...), each a list of strings. Their
	// meaning belongs to the language layer; the image only carries them.
	Commands map[string][]string `yaml:"commands" json:"commands"`
	// Dependencies are the language's package managers: how to install what
	// a manifest file lists and how to add named packages. Their meaning,
	// like that of Commands, belongs to the language layer (pkg/lang).
	Dependencies []Dependency `yaml:"dependencies" json:"dependencies,omitempty"`
	// Setup lines run as root in the chroot, in one `sh -eu` script, after
	// the packages are installed and before the files, the user and the
	// sandbox layout are put in place. /proc is mounted and apt works.
	Setup []string `yaml:"setup" json:"setup"`

	// Dir is the directory the recipe was loaded from; file sources are
	// resolved against it. It is not part of the recipe's identity.
	Dir string `yaml:"-" json:"-"`
}

// FileSpec is one file copied from the recipes directory into the image.
type FileSpec struct {
	// Src is relative to <recipes>/files/<name>/ or, failing that, to the
	// recipes directory itself.
	Src string `yaml:"src" json:"src"`
	// Dest is the absolute path in the image.
	Dest string `yaml:"dest" json:"dest"`
	// Mode is the file's permission mode; absent (or 0) means 0644. The
	// file is owned by root.
	Mode FileMode `yaml:"mode" json:"mode"`
}

// Dependency is one package manager of a language image.
type Dependency struct {
	// Manager names it (pip, npm, go, cargo, ...).
	Manager string `yaml:"manager" json:"manager"`
	// Manifest is the file (relative to the workspace) whose presence asks
	// for Install, e.g. requirements.txt.
	Manifest string `yaml:"manifest" json:"manifest,omitempty"`
	// Install installs what Manifest lists.
	Install []string `yaml:"install" json:"install,omitempty"`
	// Add installs named packages ({packages} stands for them).
	Add []string `yaml:"add" json:"add,omitempty"`
	// OfflineEnv is added to the environment of Install and Add when the
	// sandbox has no network, so that the manager fails fast instead of
	// retrying, and succeeds from local sources.
	OfflineEnv map[string]string `yaml:"offline_env" json:"offline_env,omitempty"`
	// OfflineErrors are output fragments that, from a sandbox without
	// network, mean the manager needed the network.
	OfflineErrors []string `yaml:"offline_errors" json:"offline_errors,omitempty"`
}

// UserSpec is the unprivileged account commands run as inside the image.
type UserSpec struct {
	Name  string `yaml:"name" json:"name"`
	UID   int    `yaml:"uid" json:"uid"`
	GID   int    `yaml:"gid" json:"gid"`
	Home  string `yaml:"home" json:"home"`
	Shell string `yaml:"shell" json:"shell"`
}

// FileMode is a permission mode written in octal ("0755") in recipes and in
// image metadata. YAML reads a bare 0755 as a decimal or octal integer
// depending on the YAML version, so the text is always parsed as octal here.
type FileMode uint32

// UnmarshalYAML parses the scalar as an octal number, with or without a
// leading "0" or "0o".
func (m *FileMode) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: mode must be an octal number such as 0644", n.Line)
	}
	v, err := parseOctalMode(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*m = v
	return nil
}

// MarshalJSON writes the mode as an octal string.
func (m FileMode) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(m.String())), nil
}

// UnmarshalJSON reads the octal string written by MarshalJSON.
func (m *FileMode) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("mode: %w", err)
	}
	v, err := parseOctalMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// String returns the mode in the recipe notation, e.g. "0644".
func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

func parseOctalMode(s string) (FileMode, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("mode %q is not an octal permission mode (0000-7777)", s)
	}
	return FileMode(v), nil
}

// Defaults applied to fields a recipe leaves out.
const (
	DefaultVariant  = "minbase"
	DefaultUserName = "sandbox"
	DefaultUID      = 1000
	defaultFileMode = FileMode(0o644)
	defaultShell    = "/bin/sh"
)

var (
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	suiteRE    = regexp.MustCompile(`^[a-z][a-z0-9.-]{0,62}$`)
	packageRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	commandRE  = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)
)

// variants are the mmdebstrap variants a recipe may name. extract and
// custom are left out: they produce trees without a working dpkg, which the
// builder needs for the package list and users need for apt.
var variants = []string{"essential", "apt", "required", "minbase", "buildd", "important", "debootstrap", "standard"}

// ValidName reports whether name can name a recipe and its image: 1 to 63
// of a-z, 0-9, '_' and '-', starting with a letter.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// LoadRecipe reads, defaults and validates one recipe file. Unknown keys,
// invalid values and missing file sources are errors naming the field; all
// such errors are errdefs.InvalidArgument.
func LoadRecipe(file string) (*Recipe, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read recipe: %w", err)
	}
	r, err := parseRecipe(data)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "recipe %s: %v", file, err)
	}
	r.Dir = filepath.Dir(file)
	stem := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	problems := r.problems()
	if r.Name != "" && r.Name != stem {
		problems = append(problems, fmt.Sprintf("name: %q must match the file name %q", r.Name, stem))
	}
	if len(problems) > 0 {
		return nil, errdefs.Invalidf("recipe %s: %s", file, strings.Join(problems, "; "))
	}
	return r, nil
}

// LoadRecipes loads every *.yaml file in dir, keyed by recipe name.
func LoadRecipes(dir string) (map[string]*Recipe, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list recipes: %w", err)
	}
	recipes := make(map[string]*Recipe, len(files))
	var errs []error
	for _, f := range files {
		r, err := LoadRecipe(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recipes[r.Name] = r
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return recipes, nil
}

// parseRecipe decodes strictly (unknown keys are errors) and fills in the
// defaults, without validating.
func parseRecipe(data []byte) (*Recipe, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var r Recipe
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty recipe")
		}
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("a recipe file holds exactly one YAML document")
	}
	r.applyDefaults()
	return &r, nil
}

func (r *Recipe) applyDefaults() {
	if r.Variant == "" {
		r.Variant = DefaultVariant
	}
	u := &r.User
	if u.Name == "" {
		u.Name = DefaultUserName
	}
	if u.UID == 0 {
		u.UID = DefaultUID
	}
	if u.GID == 0 {
		u.GID = u.UID
	}
	if u.Home == "" {
		u.Home = "/home/" + u.Name
	}
	if u.Shell == "" {
		u.Shell = defaultShell
	}
	for i := range r.Files {
		if r.Files[i].Mode == 0 {
			r.Files[i].Mode = defaultFileMode
		}
	}
}

// Validate checks a recipe (defaults applied) and returns an
// errdefs.InvalidArgument error listing every problem by field.
func (r *Recipe) Validate() error {
	if p := r.problems(); len(p) > 0 {
		return errdefs.Invalidf("recipe %s: %s", r.Name, strings.Join(p, "; "))
	}
	return nil
}

// problems lists what is wrong with r, each naming its field.
func (r *Recipe) problems() []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }

	if !nameRE.MatchString(r.Name) {
		add("name: %q must be lower-case letters, digits, '-' or '_', starting with a letter", r.Name)
	}
	if r.Suite != "" && !suiteRE.MatchString(r.Suite) {
		add("suite: %q is not a Debian suite name", r.Suite)
	}
	if !slices.Contains(variants, r.Variant) {
		add("variant: %q is not one of %s", r.Variant, strings.Join(variants, ", "))
	}
	seen := map[string]bool{}
	for i, pkg := range r.Packages {
		switch {
		case !packageRE.MatchString(pkg):
			add("packages[%d]: %q is not a Debian package name", i, pkg)
		case seen[pkg]:
			add("packages[%d]: %q is listed twice", i, pkg)
		}
		seen[pkg] = true
	}
	r.fileProblems(add)
	for _, k := range sortedKeys(r.Env) {
		if !envKeyRE.MatchString(k) {
			add("env.%s: not a valid environment variable name", k)
		}
		if strings.ContainsRune(r.Env[k], 0) {
			add("env.%s: value contains a NUL byte", k)
		}
	}
	r.User.problems(add)
	for _, k := range sortedKeys(r.Commands) {
		if !commandRE.MatchString(k) {
			add("commands.%s: command names are lower-case words", k)
		}
		if len(r.Commands[k]) == 0 {
			add("commands.%s: must be a non-empty list of strings", k)
		}
	}
	r.dependencyProblems(add)
	for i, line := range r.Setup {
		if strings.TrimSpace(line) == "" {
			add("setup[%d]: empty line", i)
		}
		if strings.ContainsRune(line, 0) {
			add("setup[%d]: contains a NUL byte", i)
		}
	}
	return p
}

// problemFunc adds one problem, naming its field.
type problemFunc func(format string, args ...any)

// fileProblems checks the files a recipe copies into its image.
func (r *Recipe) fileProblems(add problemFunc) {
	dests := map[string]bool{}
	for i, f := range r.Files {
		if f.Src == "" {
			add("files[%d].src: required", i)
		} else if filepath.IsAbs(f.Src) || !filepath.IsLocal(f.Src) {
			add("files[%d].src: %q must be a relative path inside the recipes directory", i, f.Src)
		} else if _, err := r.sourcePath(f); err != nil {
			add("files[%d].src: %v", i, err)
		}
		switch {
		case !path.IsAbs(f.Dest) || path.Clean(f.Dest) != f.Dest || f.Dest == "/":
			add("files[%d].dest: %q must be a clean absolute file path", i, f.Dest)
		case dests[f.Dest]:
			add("files[%d].dest: %q is written twice", i, f.Dest)
		}
		dests[f.Dest] = true
		if f.Mode > 0o7777 {
			add("files[%d].mode: %s is not a permission mode", i, f.Mode)
		}
	}
}

// problems checks the sandbox user of a recipe.
func (u UserSpec) problems(add problemFunc) {
	if !userNameRE.MatchString(u.Name) {
		add("user.name: %q is not a valid user name", u.Name)
	}
	// 0 is root and 65534 is nobody: the sandbox user must be neither.
	if u.UID < 1 || u.UID > 65533 {
		add("user.uid: %d must be between 1 and 65533", u.UID)
	}
	if u.GID < 1 || u.GID > 65533 {
		add("user.gid: %d must be between 1 and 65533", u.GID)
	}
	if !path.IsAbs(u.Home) || path.Clean(u.Home) != u.Home || u.Home == "/" {
		add("user.home: %q must be a clean absolute directory path other than /", u.Home)
	}
	if !path.IsAbs(u.Shell) || path.Clean(u.Shell) != u.Shell {
		add("user.shell: %q must be a clean absolute path", u.Shell)
	}
}

// dependencyProblems checks a recipe's dependency managers.
func (r *Recipe) dependencyProblems(add problemFunc) {
	managers := map[string]bool{}
	for i, d := range r.Dependencies {
		switch {
		case !commandRE.MatchString(d.Manager):
			add("dependencies[%d].manager: %q must be a lower-case word", i, d.Manager)
		case managers[d.Manager]:
			add("dependencies[%d].manager: %q is listed twice", i, d.Manager)
		}
		managers[d.Manager] = true
		if d.Manifest != "" && (path.IsAbs(d.Manifest) || !filepath.IsLocal(d.Manifest)) {
			add("dependencies[%d].manifest: %q must be a relative path", i, d.Manifest)
		}
		if d.Manifest != "" && len(d.Install) == 0 {
			add("dependencies[%d].install: required with a manifest", i)
		}
		if len(d.Install) == 0 && len(d.Add) == 0 {
			add("dependencies[%d]: needs install or add", i)
		}
		for _, k := range sortedKeys(d.OfflineEnv) {
			if !envKeyRE.MatchString(k) {
				add("dependencies[%d].offline_env.%s: not a valid environment variable name", i, k)
			}
		}
	}
}

// sourcePath finds a file's source: first under files/<name>/, so that
// each recipe keeps its own files apart, then in the recipes directory.
func (r *Recipe) sourcePath(f FileSpec) (string, error) {
	candidates := []string{
		filepath.Join(r.Dir, "files", r.Name, f.Src),
		filepath.Join(r.Dir, f.Src),
	}
	for _, c := range candidates {
		fi, err := os.Stat(c)
		if err == nil && fi.Mode().IsRegular() {
			return c, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", c, err)
		}
	}
	return "", fmt.Errorf("%q is not a regular file in %s or %s",
		f.Src, filepath.Join(r.Dir, "files", r.Name), r.Dir)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
