package oci_test

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

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// Test images are assembled blob by blob, so that a test controls every
// byte a registry serves: the compression of each layer, the diff ids the
// config claims, the manifest's size.

// entry is one tar entry of a test layer.
type entry struct {
	name     string
	typ      byte
	body     string
	mode     int64
	uid, gid int
	link     string
	size     int64 // with a nil body: that many zero bytes
}

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		size := int64(len(e.body))
		if e.size > 0 {
			size = e.size
		}
		if typ != tar.TypeReg {
			size = 0
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Uid: e.uid, Gid: e.gid, Linkname: e.link, Size: size, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if typ == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if e.size > 0 {
				if _, err := io.CopyN(tw, zeros{}, e.size); err != nil {
					t.Fatal(err)
				}
			} else if _, err := tw.Write([]byte(e.body)); err != nil {
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

// treeTar tars the directory tree at dir as an image layer.
func treeTar(t testing.TB, dir string) []byte {
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

// layer is a test layer: its uncompressed tar and how it is compressed.
type layer struct {
	tar  []byte
	comp string // gzip, zstd, none
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

// imageOpts change how makeImage assembles an image, for hostile ones.
type imageOpts struct {
	arch          string
	lieDiffID     bool              // config names a diff id the layer does not have
	annotations   map[string]string // bulk up the manifest
	configPadding int               // bulk up the config
}

func makeImage(t testing.TB, cfg v1.Config, layers []layer, o imageOpts) v1.Image {
	t.Helper()
	arch := o.arch
	if arch == "" {
		arch = "amd64"
	}
	cf := v1.ConfigFile{Architecture: arch, OS: "linux", Config: cfg, RootFS: v1.RootFS{Type: "layers"}}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Annotations: o.annotations}
	ri := &rawImage{blobs: map[v1.Hash]blob{}}
	for _, l := range layers {
		diff := sha(l.tar)
		if o.lieDiffID {
			diff = sha(append([]byte("lie"), l.tar...))
		}
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, diff)
		var data []byte
		var mt types.MediaType
		switch l.comp {
		case "gzip":
			var buf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
			zw.Write(l.tar)
			zw.Close()
			data, mt = buf.Bytes(), types.OCILayer
		case "zstd":
			enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
			data, mt = enc.EncodeAll(l.tar, nil), types.OCILayerZStd
		default:
			data, mt = l.tar, types.OCIUncompressedLayer
		}
		ri.blobs[sha(data)] = blob{data: data, mt: mt}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: mt, Size: int64(len(data)), Digest: sha(data)})
	}
	if o.configPadding > 0 {
		cf.Config.Labels = map[string]string{"padding": string(bytes.Repeat([]byte("x"), o.configPadding))}
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

// push writes img to ref on reg.
func push(t testing.TB, reg *testenv.Registry, ref string, img v1.Image) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, registryOpts(reg)...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return r
}

func registryOpts(reg *testenv.Registry) []remote.Option {
	opts := []remote.Option{remote.WithTransport(reg.Transport())}
	if reg.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: reg.Username, Password: reg.Password}))
	}
	return opts
}
