package autofix

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/aymanbagabas/go-udiff"
	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// Workspace is the directory of the program's files inside the sandbox.
// Every path an answer names resolves below it; a path that would leave it
// makes the answer refused (security boundary: a fixer is untrusted input,
// and the files it writes end up in the sandbox and in the run record).
const Workspace = "/workspace"

// RefusedError is an answer that could not be applied: a diff that does not
// apply, a path outside /workspace, an answer with no code in it. The loop
// records the attempt as refused and tells the fixer why.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "fix refused: " + e.Reason }

func refusedf(format string, args ...any) error {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

// IsRefused reports whether err is a refused answer.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// Files are a program's files by clean path relative to /workspace.
type Files map[string][]byte

// Clone copies fs (the contents are shared: they are never modified in
// place).
func (fs Files) Clone() Files {
	out := make(Files, len(fs))
	for k, v := range fs {
		out[k] = v
	}
	return out
}

// Names lists the paths, sorted.
func (fs Files) Names() []string {
	out := make([]string, 0, len(fs))
	for k := range fs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Equal reports whether fs and other hold the same paths and contents.
func (fs Files) Equal(other Files) bool {
	if len(fs) != len(other) {
		return false
	}
	for k, v := range fs {
		w, ok := other[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// Changed lists the paths whose content differs between fs and other
// (added, removed or modified), sorted.
func (fs Files) Changed(other Files) []string {
	var out []string
	for k, v := range fs {
		if w, ok := other[k]; !ok || !bytes.Equal(v, w) {
			out = append(out, k)
		}
	}
	for k := range other {
		if _, ok := fs[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// WorkspacePath turns a path an answer names (relative to /workspace, or
// absolute under it) into a clean relative path; anything else is refused.
func WorkspacePath(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) || len(p) > 1024 {
		return "", refusedf("bad file path %q", p)
	}
	rel := p
	if path.IsAbs(p) {
		c := path.Clean(p)
		if !strings.HasPrefix(c, Workspace+"/") {
			return "", refusedf("path %q is outside %s", p, Workspace)
		}
		rel = strings.TrimPrefix(c, Workspace+"/")
	}
	if !filepath.IsLocal(rel) || strings.Contains(rel, "\\") {
		return "", refusedf("path %q is outside %s", p, Workspace)
	}
	return path.Clean(rel), nil
}

// Apply applies a fixer's answer to files and returns the new files. The
// answer is, in order of preference:
//
//   - a unified diff (git's or the traditional one, possibly inside a
//     fenced block), applied with go-gitdiff;
//   - fenced code blocks whose info string ends with the file's path
//     ("```python main.py"), each the complete new content of that file;
//   - for a program of one file: one bare fenced block, or else the whole
//     answer, as the entrypoint's new content.
//
// A result that is not applicable is a *RefusedError.
func Apply(files Files, entrypoint, answer string) (Files, error) {
	if strings.TrimSpace(answer) == "" {
		return nil, refusedf("the answer is empty")
	}
	if d, ok := findDiff(answer); ok {
		return applyDiff(files, d)
	}
	blocks := fencedBlocks(answer)
	var named []fence
	for _, b := range blocks {
		if b.path != "" {
			named = append(named, b)
		}
	}
	if len(named) > 0 {
		out := files.Clone()
		for _, b := range named {
			rel, err := WorkspacePath(b.path)
			if err != nil {
				return nil, err
			}
			out[rel] = []byte(b.body)
		}
		return out, checkTree(out)
	}
	if len(files) != 1 {
		return nil, refusedf("the program has %d files: answer with a unified diff or with fenced blocks whose info string ends with each file's path", len(files))
	}
	out := Files{entrypoint: nil}
	switch len(blocks) {
	case 0:
		out[entrypoint] = []byte(ensureNewline(answer))
	case 1:
		out[entrypoint] = []byte(blocks[0].body)
	default:
		return nil, refusedf("the answer has %d unnamed code blocks; give one, or name each file after the language in the info string", len(blocks))
	}
	return out, nil
}

func ensureNewline(s string) string {
	if s != "" && !strings.HasSuffix(s, "\n") {
		return s + "\n"
	}
	return s
}

// checkTree refuses file sets where a path is both a file and a directory.
func checkTree(files Files) error {
	for rel := range files {
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			if _, clash := files[d]; clash {
				return refusedf("%q would be both a file and a directory", d)
			}
		}
	}
	return nil
}

// fence is one fenced code block of an answer.
type fence struct {
	info string // the info string
	path string // its last word when that names a file
	body string
}

// fenceOpen matches a fence's opening line: three or more backticks or
// tildes and the info string.
var fenceOpen = regexp.MustCompile("^(`{3,}|~{3,})[ \t]*([^`]*)$")

// fencedBlocks finds the fenced code blocks of a Markdown answer.
func fencedBlocks(s string) []fence {
	lines := strings.SplitAfter(s, "\n")
	var out []fence
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(strings.TrimRight(lines[i], "\r\n"))
		if m == nil {
			continue
		}
		marker, info := m[1], strings.TrimSpace(m[2])
		var body strings.Builder
		j := i + 1
		for ; j < len(lines); j++ {
			l := strings.TrimRight(lines[j], "\r\n")
			if strings.HasPrefix(strings.TrimSpace(l), marker) && strings.Trim(strings.TrimSpace(l), marker[:1]) == "" {
				break
			}
			body.WriteString(lines[j])
		}
		if j == len(lines) { // unclosed: not a block
			break
		}
		out = append(out, fence{info: info, path: infoPath(info), body: body.String()})
		i = j
	}
	return out
}

// infoPath is the file path an info string ends with ("python main.py",
// "main.py", "go path=cmd/x/main.go"), or "".
func infoPath(info string) string {
	f := strings.Fields(info)
	if len(f) == 0 {
		return ""
	}
	last := f[len(f)-1]
	for _, pfx := range []string{"path=", "file=", "title=", "filename="} {
		last = strings.TrimPrefix(last, pfx)
	}
	last = strings.Trim(last, `"'`)
	// A bare language name ("python", "go", "c++") is not a path: a path
	// has an extension or a directory, or is a known extensionless file.
	if strings.ContainsAny(last, "./") || last == "Makefile" || last == "Dockerfile" {
		return last
	}
	return ""
}

// findDiff returns the unified diff in an answer: a fenced block holding
// one, or the answer itself.
func findDiff(answer string) (string, bool) {
	for _, b := range fencedBlocks(answer) {
		if looksLikeDiff(b.body) {
			return b.body, true
		}
	}
	if looksLikeDiff(answer) {
		return answer, true
	}
	return "", false
}

var diffHeader = regexp.MustCompile(`(?m)^(diff --git |--- \S.*\n\+\+\+ \S.*\n@@ -)`)

func looksLikeDiff(s string) bool { return diffHeader.MatchString(s) }

// applyDiff applies a unified diff with go-gitdiff. Every path it names
// must resolve inside /workspace; a hunk that does not match refuses the
// whole answer (nothing is half-applied).
func applyDiff(files Files, diff string) (Files, error) {
	parsed, _, err := gitdiff.Parse(strings.NewReader(ensureNewline(diff)))
	if err != nil {
		return nil, refusedf("the diff does not parse: %v", err)
	}
	if len(parsed) == 0 {
		return nil, refusedf("the diff changes no file")
	}
	out := files.Clone()
	for _, f := range parsed {
		if f.IsBinary {
			return nil, refusedf("the diff has a binary patch")
		}
		oldName, err := diffName(files, f.OldName)
		if err != nil {
			return nil, err
		}
		newName, err := diffName(files, f.NewName)
		if err != nil {
			return nil, err
		}
		var src []byte
		if !f.IsNew {
			var ok bool
			if src, ok = out[oldName]; !ok {
				return nil, refusedf("the diff changes %s, which does not exist", f.OldName)
			}
		} else if _, exists := out[newName]; exists {
			return nil, refusedf("the diff creates %s, which exists already", f.NewName)
		}
		var dst bytes.Buffer
		if err := gitdiff.Apply(&dst, bytes.NewReader(src), f); err != nil {
			return nil, refusedf("the diff does not apply to %s: %v", displayName(f), err)
		}
		if f.IsDelete {
			delete(out, oldName)
			continue
		}
		if f.IsRename || (oldName != "" && oldName != newName) {
			delete(out, oldName)
		}
		out[newName] = dst.Bytes()
	}
	return out, checkTree(out)
}

func displayName(f *gitdiff.File) string {
	if f.NewName != "" {
		return f.NewName
	}
	return f.OldName
}

// diffName resolves a path of a diff. Traditional diffs keep git's "a/"
// and "b/" prefixes in their names; they are dropped when the name without
// them is a file of the program or the name with them is not.
func diffName(files Files, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	rel, err := WorkspacePath(name)
	if err != nil {
		return "", err
	}
	if _, ok := files[rel]; ok {
		return rel, nil
	}
	for _, pfx := range []string{"a/", "b/"} {
		if strings.HasPrefix(rel, pfx) && len(rel) > 2 {
			return strings.TrimPrefix(rel, pfx), nil
		}
	}
	return rel, nil
}

// UnifiedDiff is the unified diff from old to new, file by file in path
// order ("a/" and "b/" prefixes, /dev/null for added and removed files),
// produced with go-udiff; "" when nothing changed.
func UnifiedDiff(old, new Files) string {
	var b strings.Builder
	for _, name := range old.Changed(new) {
		o, inOld := old[name]
		n, inNew := new[name]
		from, to := "a/"+name, "b/"+name
		if !inOld {
			from = "/dev/null"
		}
		if !inNew {
			to = "/dev/null"
		}
		b.WriteString(udiff.Unified(from, to, string(o), string(n)))
	}
	return b.String()
}

// Summary says in a line what a diff changes: "main.py +1 -1".
func Summary(old, new Files) string {
	var parts []string
	for _, name := range old.Changed(new) {
		o, inOld := old[name]
		n, inNew := new[name]
		add, del := 0, 0
		for _, l := range strings.Split(udiff.Unified("a", "b", string(o), string(n)), "\n") {
			switch {
			case strings.HasPrefix(l, "+++ "), strings.HasPrefix(l, "--- "):
			case strings.HasPrefix(l, "+"):
				add++
			case strings.HasPrefix(l, "-"):
				del++
			}
		}
		switch {
		case !inOld:
			parts = append(parts, fmt.Sprintf("%s (new, %d lines)", name, add))
		case !inNew:
			parts = append(parts, fmt.Sprintf("%s (deleted)", name))
		default:
			parts = append(parts, fmt.Sprintf("%s +%d -%d", name, add, del))
		}
	}
	return strings.Join(parts, ", ")
}
