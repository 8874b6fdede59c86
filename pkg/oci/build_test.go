package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
)

func contextTar(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestUnpackContextRefusesHostileEntries: an uploaded build context with
// an entry leading out of it is refused naming the entry, and nothing is
// written outside the context's directory.
func TestUnpackContextRefusesHostileEntries(t *testing.T) {
	for _, c := range []struct {
		hdrs  []*tar.Header
		entry string
	}{
		{[]*tar.Header{{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}}, `"../evil"`},
		{[]*tar.Header{{Name: "/etc/evil", Typeflag: tar.TypeReg, Mode: 0o644}}, `"/etc/evil"`},
		{[]*tar.Header{{Name: "a/../../evil", Typeflag: tar.TypeReg, Mode: 0o644}}, `"a/../../evil"`},
		{[]*tar.Header{{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../.."}}, `"up": symlink to "../.." leads out`},
		{[]*tar.Header{{Name: "abs", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, `"abs": symlink to "/etc" leads out`},
		{[]*tar.Header{{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, `"dev": type`},
		{[]*tar.Header{{Name: "hard", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}, `"hard": type`},
	} {
		outer := t.TempDir()
		dir := filepath.Join(outer, "ctx")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		err := oci.UnpackContext(bytes.NewReader(contextTar(t, c.hdrs...)), dir, 1<<20)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), c.entry) {
			t.Errorf("context %s: %v, want invalid_argument naming %s", c.hdrs[0].Name, err, c.entry)
		}
		if _, err := os.Lstat(filepath.Join(outer, "evil")); err == nil {
			t.Errorf("context %s: wrote outside the context", c.hdrs[0].Name)
		}
	}
	// Over the size cap: limit_exceeded naming the entry.
	dir := t.TempDir()
	err := oci.UnpackContext(bytes.NewReader(contextTar(t, &tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644}, &tar.Header{Name: "b", Typeflag: tar.TypeReg, Mode: 0o644})), dir, 1)
	if errdefs.CodeOf(err) != errdefs.LimitExceeded || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("context over its cap: %v", err)
	}
}

// TestBuildRefusesSymlinkOutOfContext: a context directory holding a
// symlink that leads out (one the daemon did not unpack, as a local
// build's could) is refused when COPY reaches it, naming the entry; so is
// a COPY of a directory holding one.
func TestBuildRefusesSymlinkOutOfContext(t *testing.T) {
	st, err := image.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	im, err := oci.New(oci.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	bctx := t.TempDir()
	if err := os.Symlink(secret, filepath.Join(bctx, "leak")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(bctx, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../etc/passwd", filepath.Join(bctx, "dir", "up")); err != nil {
		t.Fatal(err)
	}
	base := &image.Image{Name: "base", Digest: strings.Repeat("ab", 32), Rootfs: t.TempDir()}
	b := oci.Builders{
		Base: func(context.Context, string) (*image.Image, error) { return base, nil },
		Run: func(context.Context, oci.RunStep, io.Writer) error {
			t.Fatal("no RUN in this Dockerfile")
			return nil
		},
	}
	for _, c := range []struct{ dockerfile, want string }{
		{"FROM base\nCOPY leak /leak\n", `line 2: COPY leak: entry "leak": a symlink leads out of the context`},
		{"FROM base\nCOPY dir /d\n", `line 2: COPY: entry "dir/up": symlink to "../../../../../../etc/passwd" leads out of the context`},
	} {
		var events []apitypes.BuildProgress
		_, err := im.Build(context.Background(), oci.BuildRequest{Dockerfile: []byte(c.dockerfile), Context: bctx}, b, func(p apitypes.BuildProgress) { events = append(events, p) })
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want invalid_argument with %q", c.dockerfile, err, c.want)
		}
	}
	// Nothing of the refused copies is in the layer store.
	entries, _ := os.ReadDir(filepath.Join(st.Dir(), "layers"))
	for _, e := range entries {
		t.Errorf("layer store holds %s after refused builds", e.Name())
	}
}

// TestCollectLayers: the layer gc removes the layers no stored image
// lists, and only those: a layer two images share stays while one of them
// does, and a layer only a build-cache entry names goes with the entry.
func TestCollectLayers(t *testing.T) {
	im, st := newImporter(t, oci.Options{})
	shared := testenv.OCILayer{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "etc/os-release", Body: "ID=gc\n"}), Comp: "gzip"}
	archive := func(tag string, layers ...testenv.OCILayer) string {
		p := filepath.Join(t.TempDir(), "a.tar")
		ref, _ := name.NewTag(tag)
		if err := tarball.WriteToFile(p, ref, testenv.MakeOCIImage(t, v1.Config{}, layers, testenv.OCIImageOpts{})); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, err := im.Import(ctx(t), archive("example.test/a:1", shared, testenv.OCILayer{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "a", Body: "a"}), Comp: "gzip"}), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := im.Import(ctx(t), archive("example.test/b:1", shared, testenv.OCILayer{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "b", Body: "b"}), Comp: "gzip"}), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := storedLayers(t, st); len(got) != 3 {
		t.Fatalf("layer store after two imports: %v", got)
	}
	// Everything is used: nothing goes.
	if removed, _, err := im.CollectLayers(); err != nil || len(removed) != 0 {
		t.Fatalf("gc with every layer used: %v %v", removed, err)
	}
	// An orphan layer a build cache entry names (a failed build's step),
	// and a spool file of a pull in flight.
	orphan := strings.Repeat("0", 63) + "1"
	if err := os.WriteFile(filepath.Join(st.Dir(), "layers", orphan), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(st.Dir(), "buildcache"), 0o700); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(st.Dir(), "buildcache", strings.Repeat("c", 64))
	if err := os.WriteFile(key, []byte(orphan+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(st.Dir(), "layers", ".partial-123")
	if err := os.WriteFile(spool, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove(a.Name); err != nil {
		t.Fatal(err)
	}
	removed, freed, err := im.CollectLayers()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a.OCI.Layers[1], "sha256:" + orphan}
	slices.Sort(want)
	slices.Sort(removed)
	if !slices.Equal(removed, want) || freed <= 0 {
		t.Errorf("gc after removing image a: removed %v (%d bytes), want %v", removed, freed, want)
	}
	for _, l := range b.OCI.Layers {
		if _, err := os.Stat(filepath.Join(st.Dir(), "layers", strings.TrimPrefix(l, "sha256:"))); err != nil {
			t.Errorf("layer %s of image b: %v", l, err)
		}
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Errorf("cache entry of a removed layer kept: %v", err)
	}
	if _, err := os.Stat(spool); err != nil {
		t.Errorf("spool file of a pull in flight removed: %v", err)
	}
}

// TestPullFetchesLayersInParallel: a pull of an image of five layers
// fetches up to three blobs at once, never more, and the image is the same
// as a pull one layer at a time would make (every digest checked). The
// registry is go-containerregistry's in-memory one behind TLS, with a
// handler that holds each blob GET until three are in flight (or a bound
// of seconds passes, so that a serial pull ends, slowly, and fails).
func TestPullFetchesLayersInParallel(t *testing.T) {
	var layers []testenv.OCILayer
	for i := range 5 {
		layers = append(layers, testenv.OCILayer{Tar: testenv.TarOf(t, testenv.TarEntry{Name: fmt.Sprintf("l%d", i), Body: strings.Repeat("x", 1000+i)}), Comp: "gzip"})
	}
	img := testenv.MakeOCIImage(t, v1.Config{}, layers, testenv.OCIImageOpts{})
	cfgDigest, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		inFlight int
		maxSeen  int
		total    int
		three    = make(chan struct{}) // closed when three are in flight
		once     sync.Once
	)
	reg := registry.New()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") || strings.Contains(r.URL.Path, cfgDigest.Hex) {
			reg.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		inFlight++
		total++
		maxSeen = max(maxSeen, inFlight)
		first := total <= 3
		if inFlight >= 3 {
			once.Do(func() { close(three) })
		}
		mu.Unlock()
		if first {
			// The first three wait for each other (a serial pull gives up
			// after the bound, slowly, and fails below).
			select {
			case <-three:
			case <-time.After(3 * time.Second):
			}
		}
		reg.ServeHTTP(w, r)
		mu.Lock()
		inFlight--
		mu.Unlock()
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "https://")
	ref, err := name.ParseReference(host + "/par/img:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(srv.Client().Transport)); err != nil {
		t.Fatal(err)
	}
	im, _ := newImporter(t, oci.Options{CAFiles: []string{caFile}})
	got, err := im.Pull(ctx(t), "reference", ref.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := cfgDigest; got.Digest != want.Hex || len(got.OCI.Layers) != 5 {
		t.Errorf("pulled %s with %d layers, want %s with 5", got.Digest, len(got.OCI.Layers), want.Hex)
	}
	mu.Lock()
	defer mu.Unlock()
	if maxSeen != 3 {
		t.Errorf("at most %d blob downloads at once, want 3 (the bound)", maxSeen)
	}
}

// TestCopyIntoWorkdir: a COPY whose destination is "." or ends in "/." is
// the WORKDIR as a directory (BuildKit's reading), so the file lands in
// it under its own name; a WORKDIR where a copied file is is
// invalid_argument, not an internal error.
func TestCopyIntoWorkdir(t *testing.T) {
	st, err := image.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	im, err := oci.New(oci.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	bctx := t.TempDir()
	if err := os.WriteFile(filepath.Join(bctx, "main.py"), []byte("print(1)"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := &image.Image{Name: "base", Digest: strings.Repeat("ab", 32), Rootfs: t.TempDir()}
	b := oci.Builders{Base: func(context.Context, string) (*image.Image, error) { return base, nil }}
	out, err := im.Build(context.Background(), oci.BuildRequest{Context: bctx, Tag: "app",
		Dockerfile: []byte("FROM base\nWORKDIR /app\nCOPY main.py .\nCOPY main.py sub/.\nCOPY main.py /app/named\n")}, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"app/main.py", "app/sub/main.py", "app/named"} {
		if fi, err := os.Stat(filepath.Join(out.Rootfs, p)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v", p, err)
		}
	}
	_, err = im.Build(context.Background(), oci.BuildRequest{Context: bctx, Tag: "clash",
		Dockerfile: []byte("FROM base\nCOPY main.py /x\nWORKDIR /x\n")}, b, nil)
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "WORKDIR /x") {
		t.Errorf("WORKDIR over a copied file: %v, want invalid_argument naming it", err)
	}
}
