// Package webui holds the web editor's bundle (web/, built by `make build`
// with esbuild into dist/) embedded in the daemon binary, so that the daemon
// serves the editor with no files beside it and no CDN at run time.
//
// Only the bundle lives here; who may fetch it is decided by pkg/api's
// authentication, which serves these files to authenticated browsers only.
//
// dist/ is generated and not committed, except dist/.gitkeep, which keeps
// the embed pattern valid (and `go vet ./...` working) on a clean clone
// before the first `make build`: such a binary answers Built() == false and
// the daemon serves a page that says how to build the editor.
package webui

import (
	"embed"
	"io/fs"
)

//go:embed all:dist
var dist embed.FS

// Files returns the bundle: index.html at its root, assets under assets/.
func Files() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // "dist" is a valid, embedded directory name
	}
	return sub
}

// Built reports whether the bundle was built into this binary.
func Built() bool {
	_, err := fs.Stat(Files(), "index.html")
	return err == nil
}
