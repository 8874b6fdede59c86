package testenv

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// OCI test images are assembled blob by blob, so that a test controls every
// byte a registry serves: the compression of each layer, the diff ids the
// config claims, the manifest's size.

// TarEntry is one tar entry of a test layer.
type TarEntry struct {
	Name     string
	Type     byte
	Body     string
	Mode     int64
	UID, GID int
	Link     string
	Size     int64 // with an empty Body: that many zero bytes
}

// TarOf is a tar of entries.
func TarOf(t testing.TB, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.Mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		size := int64(len(e.Body))
		if e.Size > 0 {
			size = e.Size
		}
		if typ != tar.TypeReg {
			size = 0
		}
		hdr := &tar.Header{Name: e.Name, Typeflag: typ, Mode: mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link, Size: size, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if typ == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if e.Size > 0 {
				if _, err := io.CopyN(tw, zeros{}, e.Size); err != nil {
					t.Fatal(err)
				}
			} else if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TreeTar tars the directory tree at dir as an image layer.
func TreeTar(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil // sockets, devices: an image has none
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// OCILayer is a test layer: its uncompressed tar and how it is compressed.
type OCILayer struct {
	Tar  []byte
	Comp string // gzip, zstd, none
}

type blob struct {
	data []byte
	mt   types.MediaType
}

func (b blob) Digest() (v1.Hash, error) { return sha(b.data), nil }
func (b blob) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.data)), nil
}
func (b blob) Size() (int64, error)                { return int64(len(b.data)), nil }
func (b blob) MediaType() (types.MediaType, error) { return b.mt, nil }

func sha(data []byte) v1.Hash {
	s := sha256.Sum256(data)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(s[:])}
}

// rawImage is an image given as its raw manifest, config and blobs.
type rawImage struct {
	manifest, config []byte
	blobs            map[v1.Hash]blob
}

func (r *rawImage) RawConfigFile() ([]byte, error) { return r.config, nil }
func (r *rawImage) MediaType() (types.MediaType, error) {
	return types.OCIManifestSchema1, nil
}
func (r *rawImage) RawManifest() ([]byte, error) { return r.manifest, nil }
func (r *rawImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == sha(r.config) {
		return blob{data: r.config, mt: types.OCIConfigJSON}, nil
	}
	return r.blobs[h], nil
}

// OCIImageOpts change how MakeOCIImage assembles an image, for hostile ones.
type OCIImageOpts struct {
	Arch          string
	LieDiffID     bool              // config names a diff id the layer does not have
	Annotations   map[string]string // bulk up the manifest
	ConfigPadding int               // bulk up the config
}

// MakeOCIImage assembles an image of layers with config cfg.
func MakeOCIImage(t testing.TB, cfg v1.Config, layers []OCILayer, o OCIImageOpts) v1.Image {
	t.Helper()
	arch := o.Arch
	if arch == "" {
		arch = "amd64"
	}
	cf := v1.ConfigFile{Architecture: arch, OS: "linux", Config: cfg, RootFS: v1.RootFS{Type: "layers"}}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Annotations: o.Annotations}
	ri := &rawImage{blobs: map[v1.Hash]blob{}}
	for _, l := range layers {
		diff := sha(l.Tar)
		if o.LieDiffID {
			diff = sha(append([]byte("lie"), l.Tar...))
		}
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, diff)
		var data []byte
		var mt types.MediaType
		switch l.Comp {
		case "gzip":
			var buf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
			zw.Write(l.Tar)
			zw.Close()
			data, mt = buf.Bytes(), types.OCILayer
		case "zstd":
			enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
			data, mt = enc.EncodeAll(l.Tar, nil), types.OCILayerZStd
		default:
			data, mt = l.Tar, types.OCIUncompressedLayer
		}
		ri.blobs[sha(data)] = blob{data: data, mt: mt}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: mt, Size: int64(len(data)), Digest: sha(data)})
	}
	if o.ConfigPadding > 0 {
		cf.Config.Labels = map[string]string{"padding": string(bytes.Repeat([]byte("x"), o.ConfigPadding))}
	}
	var err error
	if ri.config, err = json.Marshal(cf); err != nil {
		t.Fatal(err)
	}
	m.Config = v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(ri.config)), Digest: sha(ri.config)}
	if ri.manifest, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	img, err := partial.CompressedToImage(ri)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Push writes img to ref on reg.
func (reg *Registry) Push(t testing.TB, ref string, img v1.Image) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, reg.RemoteOptions()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return r
}

// RemoteOptions are go-containerregistry options that reach reg.
func (reg *Registry) RemoteOptions() []remote.Option {
	opts := []remote.Option{remote.WithTransport(reg.Transport())}
	if reg.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: reg.Username, Password: reg.Password}))
	}
	return opts
}

// PythonOCIImage is the acceptance image of OCI pulls: our Debian python tree as a gzip
// layer, an uncompressed layer, and a zstd layer with a whiteout, an opaque
// directory and an account of its own, run as that account in /app.
func PythonOCIImage(t testing.TB) v1.Image {
	t.Helper()
	base := EnsureImages(t, "python")["python"].Rootfs
	passwd, err := os.ReadFile(filepath.Join(base, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	group, err := os.ReadFile(filepath.Join(base, "etc/group"))
	if err != nil {
		t.Fatal(err)
	}
	l2 := TarOf(t,
		TarEntry{Name: "opt/", Type: tar.TypeDir},
		TarEntry{Name: "opt/data/", Type: tar.TypeDir},
		TarEntry{Name: "opt/data/old.txt", Body: "lower"},
		TarEntry{Name: "opt/keep/", Type: tar.TypeDir},
		TarEntry{Name: "opt/keep/x", Body: "kept"},
		TarEntry{Name: "opt/hostetc", Type: tar.TypeSymlink, Link: "/etc"},
	)
	l3 := TarOf(t,
		TarEntry{Name: "etc/passwd", Body: string(passwd) + "app:x:1001:1001:app:/home/app:/bin/sh\n"},
		TarEntry{Name: "etc/group", Body: string(group) + "app:x:1001:\n"},
		TarEntry{Name: "etc/.wh.motd"},
		TarEntry{Name: "opt/data/", Type: tar.TypeDir},
		TarEntry{Name: "opt/data/.wh..wh..opq"},
		TarEntry{Name: "opt/data/new.txt", Body: "upper"},
		TarEntry{Name: "home/app/", Type: tar.TypeDir, UID: 1001, GID: 1001},
		TarEntry{Name: "app/", Type: tar.TypeDir, UID: 1001, GID: 1001},
		TarEntry{Name: "app/main.py", Body: "print('main')\n", UID: 1001, GID: 1001},
		TarEntry{Name: "app/run", Type: tar.TypeLink, Link: "app/main.py"},
		TarEntry{Name: "app/lib", Type: tar.TypeSymlink, Link: "../usr/lib"},
		// Through lower layers' absolute symlinks: they resolve inside
		// the image, never on the host.
		TarEntry{Name: "opt/hostetc/sandboxd-oci-marker", Body: "inside"},
		TarEntry{Name: "var/run/app.pid", Body: "1"},
	)
	cfg := v1.Config{
		User: "app", WorkingDir: "/app",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello from oci"},
		Entrypoint: []string{"python3"}, Cmd: []string{"/app/main.py"},
	}
	return MakeOCIImage(t, cfg, []OCILayer{{Tar: TreeTar(t, base), Comp: "gzip"}, {Tar: l2, Comp: "none"}, {Tar: l3, Comp: "zstd"}}, OCIImageOpts{})
}
