package image

import (
	"path/filepath"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestHostMirror(t *testing.T) {
	tests := map[string]string{
		// deb822: skips security suites, disabled and source-only stanzas
		// and cdrom: URIs; reads multi-line fields.
		"deb822": "http://192.0.2.1/debian",
		// one-line: skips comments, deb-src, security suites, third-party
		// repositories without "main"; reads [ options ].
		"oneline": "http://192.0.2.3/debian",
		// sources.list.d in name order, .sources and .list alike, other
		// file names ignored, mirror+ URIs skipped.
		"mixed": "https://192.0.2.4/debian",
		"local": "file:///srv/mirror/debian",
	}
	for dir, want := range tests {
		got, err := hostMirror(filepath.Join("testdata", "mirror", dir))
		if err != nil || got != want {
			t.Errorf("%s: hostMirror = %q, %v; want %q", dir, got, err, want)
		}
	}
}

func TestHostMirrorNone(t *testing.T) {
	for _, dir := range []string{"none", "does-not-exist"} {
		got, err := hostMirror(filepath.Join("testdata", "mirror", dir))
		if err == nil || errdefs.CodeOf(err) != errdefs.Unavailable {
			t.Errorf("%s: hostMirror = %q, %v; want an unavailable error", dir, got, err)
		}
	}
}
