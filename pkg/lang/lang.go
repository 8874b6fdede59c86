// Package lang turns a language image's recipe into the commands that
// install, compile, run, lint, build and test code in a sandbox.
//
// Handlers are data-driven: everything language-specific lives in the
// recipe (rootfs/<language>.yaml), under commands and dependencies. This
// package only knows the conventions those commands follow:
//
//   - extensions: the language's file extensions, its own first;
//   - entrypoint: the default name of the main file;
//   - version: prints the toolchain's version;
//   - compile (optional): builds the sources; its failure is the compile
//     step's and the run step does not start;
//   - run: runs the program;
//   - lint, build, test (each optional): the run_task tasks.
//
// In a command's argv an element that is exactly {files}, {args} or
// {packages} expands to as many arguments as there are sources (files with
// the language's extensions, sorted), caller arguments or packages to add;
// {file} (the entrypoint, relative to /workspace), {main} (the entrypoint's
// base name without extension), {out} (the build directory) and {path} (a
// task's target) are substituted wherever they occur. Every command runs with
// /workspace as its working directory.
package lang

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// Tasks are the run_task tasks, in the order languages_list reports them.
var Tasks = []string{"lint", "build", "test"}

// Workspace is where sources are written and commands run.
const Workspace = "/workspace"

// Handler is one language's commands, read from its recipe.
type Handler struct {
	// Name is the language, which is also its image's name.
	Name string
	// Extensions are the source file extensions, the language's own first.
	Extensions []string
	// Entrypoint is the default main file name.
	Entrypoint string
	// Version prints the toolchain's version; may be nil.
	Version []string
	// Compile builds the sources; nil for interpreted languages.
	Compile []string
	// Run runs the program.
	Run []string
	// Tasks maps the tasks this language has to their commands.
	Tasks map[string][]string
	// Dependencies are the language's package managers.
	Dependencies []image.Dependency
}

// New builds the handler of the recipe r. A recipe without a run command or
// extensions is not a language (an image for other uses) and gives an error.
func New(r *image.Recipe) (*Handler, error) {
	if r == nil {
		return nil, errors.New("lang: nil recipe")
	}
	c := r.Commands
	h := &Handler{
		Name:         r.Name,
		Extensions:   c["extensions"],
		Version:      c["version"],
		Compile:      c["compile"],
		Run:          c["run"],
		Tasks:        map[string][]string{},
		Dependencies: r.Dependencies,
	}
	if len(h.Run) == 0 {
		return nil, fmt.Errorf("lang %s: recipe has no commands.run", r.Name)
	}
	if len(h.Extensions) == 0 {
		return nil, fmt.Errorf("lang %s: recipe has no commands.extensions", r.Name)
	}
	for i, e := range h.Extensions {
		if !strings.HasPrefix(e, ".") || strings.ContainsAny(e[1:], "./") {
			return nil, fmt.Errorf("lang %s: commands.extensions[%d]: %q is not a file extension", r.Name, i, e)
		}
	}
	if ep := c["entrypoint"]; len(ep) > 0 {
		h.Entrypoint = ep[0]
	} else {
		h.Entrypoint = "main" + h.Extensions[0]
	}
	for _, t := range Tasks {
		if argv := c[t]; len(argv) > 0 {
			h.Tasks[t] = argv
		}
	}
	return h, nil
}

// Compiled reports whether the language has a compile step.
func (h *Handler) Compiled() bool { return len(h.Compile) > 0 }

// TaskNames lists the tasks the language has, in Tasks order.
func (h *Handler) TaskNames() []string {
	var out []string
	for _, t := range Tasks {
		if _, ok := h.Tasks[t]; ok {
			out = append(out, t)
		}
	}
	return out
}

// Vars are the values substituted into a command.
type Vars struct {
	File     string   // {file}: the entrypoint, relative to /workspace
	Files    []string // {files}: the sources
	Out      string   // {out}: the build directory
	Path     string   // {path}: a task's target
	Args     []string // {args}: the caller's arguments
	Packages []string // {packages}: packages to add
}

// Expand substitutes v into the command template argv (see the package
// documentation).
func Expand(argv []string, v Vars) []string {
	main := path.Base(v.File)
	main = strings.TrimSuffix(main, path.Ext(main))
	p := v.Path
	if p == "" {
		p = "."
	}
	r := strings.NewReplacer("{file}", v.File, "{main}", main, "{out}", v.Out, "{path}", p)
	out := make([]string, 0, len(argv)+len(v.Files)+len(v.Args))
	for _, a := range argv {
		switch a {
		case "{files}":
			out = append(out, v.Files...)
		case "{args}":
			out = append(out, v.Args...)
		case "{packages}":
			out = append(out, v.Packages...)
		default:
			out = append(out, r.Replace(a))
		}
	}
	return out
}

// IsSource reports whether name has one of the language's extensions.
func (h *Handler) IsSource(name string) bool {
	return slices.Contains(h.Extensions, path.Ext(name))
}

// Sources returns the names among files (paths relative to /workspace) that
// are sources of the language, sorted.
func (h *Handler) Sources(files []string) []string {
	var out []string
	for _, f := range files {
		if h.IsSource(f) {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

var javaPublicClass = regexp.MustCompile(`(?m)^\s*public\s+(?:(?:final|abstract|sealed)\s+)*(?:class|record|enum|interface)\s+([A-Za-z_][A-Za-z0-9_]*)`)

// FileNameFor names the main file for code given as a single string: the
// entrypoint, except where the language ties the file name to the code
// (Java's public class).
func (h *Handler) FileNameFor(code string) string {
	if path.Ext(h.Entrypoint) == ".java" {
		if m := javaPublicClass.FindStringSubmatch(code); m != nil {
			return m[1] + ".java"
		}
	}
	return h.Entrypoint
}

// ErrNoEntrypoint means MainFile found no file to run.
var ErrNoEntrypoint = errors.New("no entrypoint")

// MainFile picks the file to run among files (relative to /workspace):
// explicit if given (it must be among files), else the language's default
// entrypoint, else the only source file at the top level, else the only
// source file.
func (h *Handler) MainFile(files []string, explicit string) (string, error) {
	if explicit != "" {
		if !slices.Contains(files, explicit) {
			return "", fmt.Errorf("%w: %q is not among the files", ErrNoEntrypoint, explicit)
		}
		return explicit, nil
	}
	if slices.Contains(files, h.Entrypoint) {
		return h.Entrypoint, nil
	}
	srcs := h.Sources(files)
	var top []string
	for _, f := range srcs {
		if !strings.Contains(f, "/") {
			top = append(top, f)
		}
	}
	switch {
	case len(top) == 1:
		return top[0], nil
	case len(top) == 0 && len(srcs) == 1:
		return srcs[0], nil
	case len(srcs) == 0:
		return "", fmt.Errorf("%w: no %s file among the files", ErrNoEntrypoint, strings.Join(h.Extensions, "/"))
	}
	return "", fmt.Errorf("%w: several %s files and none is called %s; name the one to run", ErrNoEntrypoint,
		strings.Join(h.Extensions, "/"), h.Entrypoint)
}

// Installs returns the dependency installers whose manifest is among files,
// in recipe order.
func (h *Handler) Installs(files []string) []image.Dependency {
	var out []image.Dependency
	for _, d := range h.Dependencies {
		if d.Manifest != "" && len(d.Install) > 0 && slices.Contains(files, d.Manifest) {
			out = append(out, d)
		}
	}
	return out
}

// Manager returns the package manager called name.
func (h *Handler) Manager(name string) (image.Dependency, bool) {
	for _, d := range h.Dependencies {
		if d.Manager == name {
			return d, true
		}
	}
	return image.Dependency{}, false
}

// Managers lists the names of the language's package managers that can add
// named packages.
func (h *Handler) Managers() []string {
	var out []string
	for _, d := range h.Dependencies {
		if len(d.Add) > 0 {
			out = append(out, d.Manager)
		}
	}
	return out
}

// NeededNetwork reports whether output, from a failed install by d in a
// sandbox without network, says that the manager needed the network.
func NeededNetwork(d image.Dependency, output string) bool {
	for _, s := range d.OfflineErrors {
		if s != "" && strings.Contains(output, s) {
			return true
		}
	}
	return false
}
