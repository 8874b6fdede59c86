package main

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// writeTar writes name → content files (mode 0755) into a tar at p.
func writeTar(t *testing.T, p string, files map[string]string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestImageArchive builds the image from a stand-in base and stand-in
// binaries (the packaging is what is tested here; make test-kubernetes
// imports the real one into containerd and runs it) and reads the archive
// back as containerd would: an OCI layout whose index names the image, a
// valid image, and the files where the chart's paths expect them.
func TestImageArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"mcp-sandboxd", "sandboxctl", "sandbox-agent", "sandbox-init"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/true "+b), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	base := filepath.Join(dir, "base.tar")
	writeTar(t, base, map[string]string{"etc/debian_version": "12.0\n", "usr/bin/mmdebstrap": "#!/bin/sh\n"})
	out := filepath.Join(dir, "image.tar")
	o := options{bin: bin, tree: "../..", out: out, name: "mcp-sandboxd:1.2.3", base: base, version: "1.2.3"}
	if err := run(context.Background(), o); err != nil {
		t.Fatalf("build: %v", err)
	}

	// Unpack the archive and open it as an OCI layout.
	lay := filepath.Join(dir, "layout")
	untar(t, out, lay)
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Annotations["io.containerd.image.name"] != "docker.io/library/mcp-sandboxd:1.2.3" || desc.Annotations["org.opencontainers.image.ref.name"] != "1.2.3" {
		t.Errorf("index annotations %v: ctr import would not name the image mcp-sandboxd:1.2.3", desc.Annotations)
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", desc.MediaType)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("invalid image: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cf.Config.Cmd, []string{"mcp-sandboxd", "serve"}) || cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.Labels["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("config %+v", cf.Config)
	}

	// The flattened file system: base and application layer together.
	got := map[string]int64{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got["/"+strings.TrimPrefix(h.Name, "./")] = h.Mode
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
	}
	for path, mode := range map[string]int64{
		"/usr/bin/mcp-sandboxd": 0o755, "/usr/bin/sandboxctl": 0o755, "/usr/libexec/mcp-sandboxd/sandbox-agent": 0o755,
		"/usr/libexec/mcp-sandboxd/sandbox-init":                0o755,
		"/etc/mcp-sandboxd/mcp-sandboxd.yaml":                   0o644,
		"/usr/share/mcp-sandboxd/seccomp-profiles/default.json": 0o644,
		"/usr/share/mcp-sandboxd/rootfs/python.yaml":            0o644,
		"/etc/debian_version":                                   0o755, // from the base
	} {
		if m, ok := got[path]; !ok {
			t.Errorf("%s missing from the image", path)
		} else if m&0o7777 != mode {
			t.Errorf("%s mode %o, want %o", path, m, mode)
		}
	}

	// Same inputs, same image: the application layer is reproducible.
	out2 := filepath.Join(dir, "image2.tar")
	o.out = out2
	if err := run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	lay2 := filepath.Join(dir, "layout2")
	untar(t, out2, lay2)
	idx2, err := layout.ImageIndexFromPath(lay2)
	if err != nil {
		t.Fatal(err)
	}
	im2, _ := idx2.IndexManifest()
	if im2.Manifests[0].Digest != desc.Digest {
		t.Errorf("rebuild changed the digest: %s then %s", desc.Digest, im2.Manifests[0].Digest)
	}
}

// TestImageOptionsRefused: names and versions that would break the
// archive's annotations or a shell are refused, naming the flag.
func TestImageOptionsRefused(t *testing.T) {
	for _, tc := range []struct{ name, version, field string }{
		{"Mcp-Sandboxd:dev", "dev", "name"},
		{"mcp-sandboxd", "dev", "name"}, // no tag
		{"mcp-sandboxd:dev;rm -rf /", "dev", "name"},
		{"../../etc:dev", "dev", "name"},
		{"mcp-sandboxd:dev", "1.0 $(reboot)", "version"},
		{"mcp-sandboxd:dev", "", "version"},
	} {
		o := options{name: tc.name, version: tc.version}
		err := o.validate()
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), ": "+tc.field+" ") {
			t.Errorf("name %q version %q: %v, want invalid_argument naming %s", tc.name, tc.version, err, tc.field)
		}
	}
	for _, ok := range []string{"mcp-sandboxd:dev", "registry.example:5000/sbx/mcp-sandboxd:1.2.3", "localhost/mcp-sandboxd:v1"} {
		o := options{name: ok, version: "dev"}
		if err := o.validate(); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
}

func TestNormalise(t *testing.T) {
	for in, want := range map[string]string{
		"mcp-sandboxd:dev":          "docker.io/library/mcp-sandboxd:dev",
		"sbx/mcp-sandboxd:dev":      "docker.io/sbx/mcp-sandboxd:dev",
		"registry.example/sbx/m:1":  "registry.example/sbx/m:1",
		"localhost/m:1":             "localhost/m:1",
		"registry.example:5000/m:1": "registry.example:5000/m:1",
	} {
		if got := normalise(in); got != want {
			t.Errorf("normalise(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHostSuite(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"NAME=\"Debian GNU/Linux\"\nVERSION_CODENAME=bookworm\n": "bookworm",
		"VERSION_CODENAME=\"trixie\"\n":                          "trixie",
		"VERSION_CODENAME=../../x\n":                             "",
		"NAME=Debian\n":                                          "",
	} {
		p := filepath.Join(dir, "os-release")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := hostSuite(p)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("%q: %q, %v; want %q", body, got, err, want)
		}
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(h.Name, "..") {
			t.Fatalf("archive entry %q escapes", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
