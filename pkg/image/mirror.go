package image

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// HostMirror returns the Debian mirror the host's own apt uses, so images
// are built from the same (possibly internal or pinned) mirror as the host
// without anyone writing its name down twice.
//
// It reads /etc/apt/sources.list and then /etc/apt/sources.list.d/*.list and
// *.sources in name order, as apt does, and returns the URI of the first
// enabled "deb" entry that has a plain suite (no "-security", "-updates" or
// other suffix) and the "main" component. Third-party repositories rarely
// match both conditions; a host where one does should name the mirror in
// the configuration (images.mirror).
func HostMirror() (string, error) { return hostMirror("/") }

// aptSource is one "deb" entry of an apt sources file.
type aptSource struct {
	uris       []string
	suites     []string
	components []string
}

func hostMirror(root string) (string, error) {
	etc := filepath.Join(root, "etc", "apt")
	files := []string{filepath.Join(etc, "sources.list")}
	parts, err := os.ReadDir(filepath.Join(etc, "sources.list.d"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read apt sources: %w", err)
	}
	var names []string
	for _, e := range parts {
		if n := e.Name(); !e.IsDir() && (strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources")) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		files = append(files, filepath.Join(etc, "sources.list.d", n))
	}

	for _, file := range files {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read apt sources: %w", err)
		}
		var sources []aptSource
		if strings.HasSuffix(file, ".sources") {
			sources, err = parseDeb822Sources(f)
		} else {
			sources, err = parseOneLineSources(f)
		}
		f.Close()
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", file, err)
		}
		for _, s := range sources {
			if uri := s.mirror(); uri != "" {
				return uri, nil
			}
		}
	}
	return "", errdefs.Unavailablef("no Debian mirror found in %s; set images.mirror in the configuration", etc)
}

// mirror returns the source's first usable URI if the source looks like a
// Debian mirror, else "".
func (s aptSource) mirror() string {
	plain := slices.ContainsFunc(s.suites, func(suite string) bool {
		return suite != "" && !strings.ContainsAny(suite, "-/")
	})
	if !plain || !slices.Contains(s.components, "main") {
		return ""
	}
	for _, u := range s.uris {
		// mmdebstrap fetches with apt's http, https and file methods;
		// cdrom:, mirror+ and tor+ URIs need host-side setup a build
		// chroot does not have.
		if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/") {
			return u
		}
	}
	return ""
}

// parseDeb822Sources parses the deb822 format of sources.list(5): stanzas
// separated by blank lines, "Key: value" fields, continuation lines that
// start with white space, and "#" comment lines.
func parseDeb822Sources(r io.Reader) ([]aptSource, error) {
	var (
		out    []aptSource
		fields = map[string]string{}
		last   string
	)
	flush := func() {
		if len(fields) == 0 {
			return
		}
		enabled := !slices.Contains([]string{"no", "false", "0"}, strings.ToLower(fields["enabled"]))
		if enabled && slices.Contains(strings.Fields(fields["types"]), "deb") {
			out = append(out, aptSource{
				uris:       strings.Fields(fields["uris"]),
				suites:     strings.Fields(fields["suites"]),
				components: strings.Fields(fields["components"]),
			})
		}
		fields = map[string]string{}
		last = ""
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last == "" {
				return nil, fmt.Errorf("continuation line %q outside a field", line)
			}
			fields[last] += " " + strings.TrimSpace(line)
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				return nil, fmt.Errorf("line %q is not a field", line)
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	return out, nil
}

// parseOneLineSources parses the one-line format:
// "deb [ option=value ... ] uri suite [component ...]".
func parseOneLineSources(r io.Reader) ([]aptSource, error) {
	var out []aptSource
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			end := slices.IndexFunc(f, func(s string) bool { return strings.HasSuffix(s, "]") })
			if end < 0 {
				return nil, fmt.Errorf("unterminated option list in %q", line)
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("%q lacks a URI or suite", line)
		}
		out = append(out, aptSource{uris: f[:1], suites: f[1:2], components: f[2:]})
	}
	return out, sc.Err()
}
