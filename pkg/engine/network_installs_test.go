package engine

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// upstreamRegistries adds to the topology's upstream server a one-package
// npm registry (/npm/) and a one-module Go module proxy (/goproxy/), both
// built by the test, and counts what they serve.
type upstreamRegistries struct {
	mu     sync.Mutex
	served map[string]int // URL path → GETs
	goSum  string         // go.sum lines of the module
}

func (u *upstreamRegistries) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.served[path]
}

func (u *upstreamRegistries) serve(path string, contentType string, body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.served[path]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", contentType)
		w.Write(body)
	}
}

const (
	npmTarballPath = "/npm/greetjs/-/greetjs-1.0.0.tgz"
	goModule       = "pkg.example.test/greet"
	goZipPath      = "/goproxy/pkg.example.test/greet/@v/v1.0.0.zip"
)

func addUpstreamRegistries(t *testing.T, tp *netTopology) *upstreamRegistries {
	t.Helper()
	u := &upstreamRegistries{served: map[string]int{}}

	// npm: the package document names the tarball with its sha1 and
	// sha512 integrity, as a registry does.
	tgz := npmTarball(t, map[string]string{
		"package/package.json": `{"name": "greetjs", "version": "1.0.0", "main": "index.js"}`,
		"package/index.js":     "exports.hello = () => 'hello from the npm registry';\n",
	})
	sha1sum := sha1.Sum(tgz)
	sha512sum := sha512.Sum512(tgz)
	doc, err := json.Marshal(map[string]any{
		"name": "greetjs", "dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": "greetjs", "version": "1.0.0", "main": "index.js",
			"dist": map[string]string{
				"tarball":   "http://pkg.example.test" + npmTarballPath,
				"shasum":    hex.EncodeToString(sha1sum[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tp.mux.HandleFunc("/npm/greetjs", u.serve("/npm/greetjs", "application/json", doc))
	tp.mux.HandleFunc(npmTarballPath, u.serve(npmTarballPath, "application/octet-stream", tgz))

	// Go: the GOPROXY protocol's list, info, mod and zip of one version;
	// the zip is made by golang.org/x/mod/zip, the go.sum lines by dirhash,
	// as the go command checks them.
	dir := t.TempDir()
	gomod := "module " + goModule + "\n\ngo 1.19\n"
	files := map[string]string{
		"go.mod":   gomod,
		"greet.go": "package greet\n\n// Hello greets.\nfunc Hello() string { return \"hello from the Go module proxy\" }\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mv := module.Version{Path: goModule, Version: "v1.0.0"}
	var zipBuf bytes.Buffer
	if err := modzip.CreateFromDir(&zipBuf, mv, dir); err != nil {
		t.Fatal(err)
	}
	zipFile := filepath.Join(t.TempDir(), "m.zip")
	if err := os.WriteFile(zipFile, zipBuf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	h1, err := dirhash.HashZip(zipFile, dirhash.Hash1)
	if err != nil {
		t.Fatal(err)
	}
	h1mod, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(gomod)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	u.goSum = fmt.Sprintf("%s v1.0.0 %s\n%s v1.0.0/go.mod %s\n", goModule, h1, goModule, h1mod)
	base := "/goproxy/" + goModule + "/@v/"
	tp.mux.HandleFunc(base+"list", u.serve(base+"list", "text/plain", []byte("v1.0.0\n")))
	tp.mux.HandleFunc(base+"v1.0.0.info", u.serve(base+"v1.0.0.info", "application/json", []byte(`{"Version":"v1.0.0","Time":"2026-01-01T00:00:00Z"}`)))
	tp.mux.HandleFunc(base+"v1.0.0.mod", u.serve(base+"v1.0.0.mod", "text/plain", []byte(gomod)))
	tp.mux.HandleFunc(goZipPath, u.serve(goZipPath, "application/zip", zipBuf.Bytes()))
	return u
}

// npmTarball is a gzipped tar of files, as npm pack makes it.
func npmTarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestNetworkInstallsNpmAndGo: run_code in node and Go with a manifest
// naming a package installs it over the network from the registries
// configured in network.package_indexes (served upstream of the test's
// host namespace) and uses it.
func TestNetworkInstallsNpmAndGo(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t)
	reg := addUpstreamRegistries(t, tp)
	testenv.EnsureImages(t, "shell", "javascript", "go")
	env := newEngineIn(t, tp.HostNS, upstreamNetwork("sbxt"+randHex(2)), func(c *config.Config) {
		c.Network.PackageIndexes.NpmRegistry = "http://pkg.example.test/npm/"
		c.Network.PackageIndexes.GoProxy = "http://pkg.example.test/goproxy"
	})

	run := env.runCode(t, RunCodeRequest{Language: "javascript", Network: NetworkEgress, Files: map[string]string{
		"main.js":      "console.log(require('greetjs').hello());\n",
		"package.json": `{"name": "app", "version": "0.0.1", "private": true, "dependencies": {"greetjs": "^1.0.0"}}`,
	}})
	if run.Stdout != "hello from the npm registry\n" || !slices.Equal(stepNames(run), []string{StepInstall, StepRun}) || reg.count(npmTarballPath) != 1 {
		t.Errorf("run_code javascript with package.json from the registry (tarball served %d times): %s", reg.count(npmTarballPath), describe(run))
	}

	// The module is not in the public checksum database: the program's
	// go.sum pins it, as a project's own go.sum does, and GONOSUMDB keeps
	// the go command from asking the database.
	run = env.runCode(t, RunCodeRequest{Language: "go", Network: NetworkEgress, Env: map[string]string{"GONOSUMDB": "pkg.example.test"}, Files: map[string]string{
		"main.go": "package main\n\nimport (\n\t\"fmt\"\n\n\t\"" + goModule + "\"\n)\n\nfunc main() { fmt.Println(greet.Hello()) }\n",
		"go.mod":  "module app\n\ngo 1.19\n\nrequire " + goModule + " v1.0.0\n",
		"go.sum":  reg.goSum,
	}})
	if run.Stdout != "hello from the Go module proxy\n" || !slices.Contains(stepNames(run), StepInstall) || reg.count(goZipPath) != 1 {
		t.Errorf("run_code go with go.mod from the proxy (zip served %d times): %s", reg.count(goZipPath), describe(run))
	}
}
