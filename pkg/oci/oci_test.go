package oci_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
)

func newImporter(t *testing.T, o oci.Options) (*oci.Importer, *image.Store) {
	t.Helper()
	testenv.RequireRoot(t) // layers' owners are set with chown
	st, err := image.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o.Store = st
	im, err := oci.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return im, st
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// storedLayers lists the layer store's files.
func storedLayers(t *testing.T, st *image.Store) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(st.Dir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestPullImportPython(t *testing.T) {
	reg := testenv.NewRegistry(t, true)
	img := testenv.PythonOCIImage(t)
	ref := reg.Push(t, reg.Ref("team/python:3"), img)
	manifestDigest, _ := img.Digest()
	configDigest, _ := img.ConfigName()

	// Anonymous: the private image is refused, and nothing is kept.
	anon, anonStore := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}})
	if _, err := anon.Pull(ctx(t), "reference", ref.String(), nil); err == nil || errdefs.CodeOf(err) != errdefs.PermissionDenied {
		t.Fatalf("anonymous pull of a private image: %v (%s), want permission_denied", err, errdefs.CodeOf(err))
	}
	assertEmptyStore(t, anonStore)

	im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Auth: &oci.Keychain{
		Registries: map[string]oci.Credential{reg.Host: {Username: reg.Username, Password: reg.Password}},
	}})
	var events []apitypes.ImageProgress
	start := time.Now()
	got, err := im.Pull(ctx(t), "reference", ref.String(), func(p apitypes.ImageProgress) { events = append(events, p) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pulled %s (%d MiB) in %v", got.Name, got.SizeBytes>>20, time.Since(start))
	if got.Digest != configDigest.Hex || got.Name != oci.NamePrefix+configDigest.Hex[:12] {
		t.Errorf("image %s digest %s, want the config digest %s", got.Name, got.Digest, configDigest.Hex)
	}
	if got.OCI == nil || got.OCI.ManifestDigest != manifestDigest.String() || got.OCI.WorkingDir != "/app" ||
		!slices.Equal(got.OCI.Entrypoint, []string{"python3"}) || len(got.OCI.Layers) != 3 {
		t.Errorf("OCI info %+v", got.OCI)
	}
	if got.User.Name != "app" || got.User.UID != 1001 || got.User.GID != 1001 || got.User.Home != "/home/app" {
		t.Errorf("user %+v, want app 1001:1001 /home/app", got.User)
	}
	if got.Env["GREETING"] != "hello from oci" {
		t.Errorf("env %v", got.Env)
	}
	if phases := len(events); phases != 5 || events[0].Phase != "resolved" || events[4].Phase != "done" || events[1].Cached {
		t.Errorf("progress %+v", events)
	}
	root := got.Rootfs
	if _, err := os.Stat("/etc/sandboxd-oci-marker"); !os.IsNotExist(err) {
		t.Errorf("a layer wrote through an absolute symlink onto the host: %v", err)
	}
	for p, want := range map[string]string{"etc/sandboxd-oci-marker": "inside", "run/app.pid": "1", "opt/data/new.txt": "upper", "opt/keep/x": "kept", "app/main.py": "print('main')\n", "app/run": "print('main')\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"opt/data/old.txt", "etc/motd"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s survived its whiteout: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "app/run")); err != nil || fi.Sys().(*syscallStat).Nlink != 2 {
		t.Errorf("app/run is not a hard link of app/main.py: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "app")); err != nil || fi.Sys().(*syscallStat).Uid != 1001 {
		t.Errorf("/app not owned by 1001: %v", err)
	}
	for _, p := range []string{"workspace", ".sandboxd", "usr/bin/python3"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if n := len(storedLayers(t, st)); n != 3 {
		t.Fatalf("%d stored layers, want 3", n)
	}
	if name, err := im.Lookup(ref.String()); err != nil || name != got.Name {
		t.Errorf("Lookup(%s) = %q, %v", ref, name, err)
	}

	// By digest, with the credentials of a Docker config.json: the same
	// image, every layer from the layer store.
	dockerCfg := filepath.Join(t.TempDir(), "config.json")
	data, _ := json.Marshal(map[string]any{"auths": map[string]any{reg.Host: map[string]string{"username": reg.Username, "password": reg.Password}}})
	if err := os.WriteFile(dockerCfg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	im2, err := oci.New(oci.Options{Store: st, CAFiles: []string{reg.CAFile}, Auth: &oci.Keychain{DockerConfig: dockerCfg}})
	if err != nil {
		t.Fatal(err)
	}
	byDigest := ref.Context().Digest(manifestDigest.String()).String()
	got2, err := im2.Pull(ctx(t), "reference", byDigest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got2.Digest != got.Digest || !slices.Contains(got2.OCI.References, byDigest) || !slices.Contains(got2.OCI.References, ref.Name()) {
		t.Errorf("by digest: %s %v", got2.Digest, got2.OCI.References)
	}

	// A docker save archive of the same image: same digest, no new layer.
	archive := filepath.Join(t.TempDir(), "python.tar")
	tag, _ := name.NewTag("example.test/python:3")
	pulled, err := remote.Image(ref, reg.RemoteOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(archive, tag, pulled); err != nil {
		t.Fatal(err)
	}
	var importEvents []apitypes.ImageProgress
	got3, err := im.Import(ctx(t), archive, "", func(p apitypes.ImageProgress) { importEvents = append(importEvents, p) })
	if err != nil {
		t.Fatal(err)
	}
	if got3.Digest != got.Digest || !slices.Contains(got3.OCI.References, tag.Name()) {
		t.Errorf("docker save import: %s %v, want %s", got3.Digest, got3.OCI.References, got.Digest)
	}
	if n := len(storedLayers(t, st)); n != 3 {
		t.Errorf("%d stored layers after the import, want 3", n)
	}

	// An OCI layout, in a directory and as a tar: the same.
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(pulled, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "example.test/py:layout"})); err != nil {
		t.Fatal(err)
	}
	got4, err := im.Import(ctx(t), dir, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got4.Digest != got.Digest || !slices.Contains(got4.OCI.References, "example.test/py:layout") {
		t.Errorf("layout import: %s %v", got4.Digest, got4.OCI.References)
	}
	if n := len(storedLayers(t, st)); n != 3 {
		t.Errorf("%d stored layers after the layout import, want 3", n)
	}
	if imgs, _ := st.List(); len(imgs) != 1 {
		t.Errorf("%d images in the store, want 1", len(imgs))
	}
}

// TestPullIndex pulls a multi-arch index: linux/amd64 is the one taken.
func TestPullIndex(t *testing.T) {
	reg := testenv.NewRegistry(t, false)
	arm := testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "arch", Body: "arm64"}), Comp: "gzip"}}, testenv.OCIImageOpts{Arch: "arm64"})
	amd := testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "arch", Body: "amd64"}), Comp: "zstd"}}, testenv.OCIImageOpts{})
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	r, _ := name.ParseReference(reg.Ref("multi/arch:1"))
	if err := remote.WriteIndex(r, idx, reg.RemoteOptions()...); err != nil {
		t.Fatal(err)
	}
	im, _ := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}})
	got, err := im.Pull(ctx(t), "reference", r.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Rootfs, "arch")); err != nil || string(b) != "amd64" {
		t.Errorf("arch file %q %v, want amd64", b, err)
	}
	want, _ := amd.ConfigName()
	if got.Digest != want.Hex {
		t.Errorf("digest %s, want amd64's %s", got.Digest, want.Hex)
	}
}

// assertEmptyStore checks that a refused image left nothing: no tree, no
// layer, no reference, no spool file, no half-done install, no lock file.
func assertEmptyStore(t *testing.T, st *image.Store) {
	t.Helper()
	err := filepath.Walk(st.Dir(), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(st.Dir(), p)
		switch {
		case rel == "." || rel == "by-name" || rel == "failed" || rel == "layers" || rel == "refs" || rel == "buildcache":
		default:
			t.Errorf("left on disk: %s", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHostileImages(t *testing.T) {
	reg := testenv.NewRegistry(t, false)
	im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, MaxSize: 16 << 20, MaxManifest: 1 << 20})
	ok := testenv.TarEntry{Name: "etc/os-release", Body: "ID=test\n"}
	cases := []struct {
		name   string
		layers []testenv.OCILayer
		opts   testenv.OCIImageOpts
		code   errdefs.Code
		want   []string
	}{
		{"dotdot", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "etc/../../escape", Body: "x"}), Comp: "gzip"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "etc/../../escape"`, `".."`}},
		{"absolute", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "/etc/cron.d/evil", Body: "x"}), Comp: "gzip"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "/etc/cron.d/evil"`, "absolute"}},
		{"symlink-out", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "a/b", Type: tar.TypeSymlink, Link: "../../../../etc"}), Comp: "zstd"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "a/b"`, "leads out"}},
		{"hardlink-out", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "shadow", Type: tar.TypeLink, Link: "../../etc/shadow"}), Comp: "gzip"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "shadow"`, "leads out"}},
		{"device", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "dev/mem2", Type: tar.TypeChar}), Comp: "none"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "dev/mem2"`, "device"}},
		{"setuid-outside", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "usr/bin/su2", Body: "#!", Mode: 0o4755, UID: 70000}), Comp: "gzip"}}, testenv.OCIImageOpts{}, errdefs.InvalidArgument, []string{`entry "usr/bin/su2"`, "setuid", "70000"}},
		{"bomb", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "zeros", Size: 64 << 20}), Comp: "gzip"}}, testenv.OCIImageOpts{}, errdefs.LimitExceeded, []string{`entry "zeros"`, "images.max_size"}},
		{"manifest-size", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok), Comp: "gzip"}}, testenv.OCIImageOpts{Annotations: map[string]string{"pad": strings.Repeat("m", 2<<20)}}, errdefs.LimitExceeded, []string{"manifest", "max_manifest_size"}},
		{"config-size", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok), Comp: "gzip"}}, testenv.OCIImageOpts{ConfigPadding: 2 << 20}, errdefs.LimitExceeded, []string{"config", "max_manifest_size"}},
		{"diffid-mismatch", []testenv.OCILayer{{Tar: testenv.TarOf(t, ok), Comp: "gzip"}}, testenv.OCIImageOpts{LieDiffID: true}, errdefs.InvalidArgument, []string{"layer 0", "diff id mismatch"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := reg.Push(t, reg.Ref("hostile/"+c.name+":1"), testenv.MakeOCIImage(t, v1.Config{}, c.layers, c.opts))
			_, err := im.Pull(ctx(t), "reference", ref.String(), nil)
			if err == nil {
				t.Fatal("hostile image pulled")
			}
			t.Logf("refused: %v", err)
			if errdefs.CodeOf(err) != c.code {
				t.Errorf("code %s, want %s: %v", errdefs.CodeOf(err), c.code, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			assertEmptyStore(t, st)
		})
	}

	// A tampered blob in an OCI layout: the layer's digest is checked.
	t.Run("layout-blob-mismatch", func(t *testing.T) {
		dir := t.TempDir()
		img := testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, ok, testenv.TarEntry{Name: "f", Body: "original"}), Comp: "none"}}, testenv.OCIImageOpts{})
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		ls, _ := img.Layers()
		d, _ := ls[0].Digest()
		p := filepath.Join(dir, "blobs", "sha256", d.Hex)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(strings.Replace(string(data), "original", "tampered", 1))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = im.Import(ctx(t), dir, "", nil)
		if err == nil || errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "layer 0") || !strings.Contains(err.Error(), "mismatch") {
			t.Fatalf("tampered layout blob: %v", err)
		}
		assertEmptyStore(t, st)
	})
}

type syscallStat = syscall.Stat_t

// BenchmarkPull measures a pull of the python acceptance image (about 250
// MiB unpacked) from a real registry on loopback into an empty store: MiB/s
// of unpacked layers, fetch, verification and unpacking included.
// Run with: go test -run '^$' -bench Pull -benchtime 3x ./pkg/oci/
func BenchmarkPull(b *testing.B) {
	testenv.RequireRoot(b)
	reg := testenv.NewRegistry(b, true)
	ref := reg.Push(b, reg.Ref("bench/python:1"), testenv.PythonOCIImage(b))
	auth := &oci.Keychain{Registries: map[string]oci.Credential{reg.Host: {Username: reg.Username, Password: reg.Password}}}
	var bytes int64
	var took time.Duration
	for i := 0; i < b.N; i++ {
		st, err := image.OpenStore(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		im, err := oci.New(oci.Options{Store: st, CAFiles: []string{reg.CAFile}, Auth: auth})
		if err != nil {
			b.Fatal(err)
		}
		var unpacked int64
		start := time.Now()
		if _, err := im.Pull(context.Background(), "reference", ref.String(), func(p apitypes.ImageProgress) {
			if p.Phase == "layer" {
				unpacked += p.Bytes
			}
		}); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		bytes += unpacked
	}
	b.ReportMetric(float64(bytes)/(1<<20)/took.Seconds(), "MiB/s")
	b.ReportMetric(float64(bytes)/float64(b.N)/(1<<20), "MiB/pull")
}

// TestPullTokenAuth pulls a private image from a registry with token auth:
// the registry's 401 names a token server, which exchanges the configured
// credentials for a bearer token; wrong credentials are refused.
func TestPullTokenAuth(t *testing.T) {
	reg := testenv.NewTokenRegistry(t)
	img := testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "token", Body: "yes"}), Comp: "gzip"}}, testenv.OCIImageOpts{})
	ref := reg.Push(t, reg.Ref("private/tok:1"), img)
	pushTokens := reg.TokensIssued.Load()
	if pushTokens == 0 {
		t.Fatal("the push got no token: the registry is not using token auth")
	}
	bad, badStore := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Auth: &oci.Keychain{
		Registries: map[string]oci.Credential{reg.Host: {Username: reg.Username, Password: "wrong"}},
	}})
	if _, err := bad.Pull(ctx(t), "reference", ref.String(), nil); errdefs.CodeOf(err) != errdefs.PermissionDenied {
		t.Errorf("pull with a wrong password: %v (%s), want permission_denied", err, errdefs.CodeOf(err))
	}
	assertEmptyStore(t, badStore)
	im, _ := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Auth: &oci.Keychain{
		Registries: map[string]oci.Credential{reg.Host: {Username: reg.Username, Password: reg.Password}},
	}})
	got, err := im.Pull(ctx(t), "reference", ref.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Rootfs, "token")); err != nil || string(b) != "yes" {
		t.Errorf("pulled file %q %v", b, err)
	}
	if reg.TokensIssued.Load() == pushTokens {
		t.Error("the pull got no token from the token server")
	}
}

// TestAbandonedSpoolRemoved: spool files a crashed daemon left beside the
// layer store go when they are old; a young one (a pull in progress) stays.
func TestAbandonedSpoolRemoved(t *testing.T) {
	_, st := newImporter(t, oci.Options{})
	dir := filepath.Join(st.Dir(), "layers")
	old, young := filepath.Join(dir, ".partial-old"), filepath.Join(dir, ".upload-young")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if _, err := oci.New(oci.Options{Store: st}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("old spool file kept: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("young spool file removed: %v", err)
	}
}

// TestRemoveDebris: spool files however young, half-written records and
// build cache entries go when the caller says nothing is in flight
// (images prune), unlike at New, which keeps young ones.
func TestRemoveDebris(t *testing.T) {
	im, st := newImporter(t, oci.Options{})
	debris := []string{"layers/.partial-1", "layers/.partial-blob-2", "layers/.upload-3", "layers/.import-4/blobs/x", "layers/.context-5/f", "refs/0123.new", "buildcache/.tmp-ab"}
	for _, d := range debris {
		p := filepath.Join(st.Dir(), d)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := oci.New(oci.Options{Store: st}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.Dir(), debris[0])); err != nil {
		t.Fatalf("a young spool file (maybe a pull's in progress) removed at New: %v", err)
	}
	removed, err := im.RemoveDebris()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != len(debris) {
		t.Errorf("removed %q, want the %d entries of %q", removed, len(debris), debris)
	}
	assertEmptyStore(t, st)
}
