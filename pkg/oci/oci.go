// Package oci brings OCI images into the image store: pulled from a
// registry speaking the OCI distribution API, or imported from a `docker
// save` archive or an OCI image layout (a directory or a tar of one).
//
// go-containerregistry talks to registries and reads archives; this
// package decides what is trusted. Every blob is checked against its
// digest and every layer against the diff id in the image's config;
// manifests and configs over images.max_manifest_size, and images whose
// unpacked layers exceed images.max_size, are refused; every tar entry
// passes applyLayer (unpack.go), which refuses what could reach outside
// the tree or outside the sandbox's ids. Layers are kept once, as
// uncompressed tars named by their diff id (<images>/layers/), however
// many images share them; each image is flattened into a tree of the image
// store (image.Store.InstallTree) named oci-<first 12 hex of its config
// digest>, so that sandboxes start from it exactly as from a recipe's
// image. Nothing of the image runs while it is unpacked, and the image's
// Entrypoint and Cmd are recorded, never run as PID 1: the sandbox's init
// and agent are the daemon's own.
package oci

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// Defaults of the limits Options leave at zero.
const (
	DefaultMaxSize     = 8 << 30
	DefaultMaxManifest = 4 << 20
	DefaultMaxID       = 65536
	// maxLayers bounds the layers of one image (Docker's own limit is
	// 127 for overlay-backed images).
	maxLayers = 127
)

// NamePrefix starts the store name of every OCI image.
const NamePrefix = "oci-"

// Options configure an Importer.
type Options struct {
	Store *image.Store
	// MaxSize caps the uncompressed size of all of an image's layers.
	MaxSize int64
	// MaxManifest caps a manifest, an index and a config, in bytes.
	MaxManifest int64
	// MaxID is the size of a sandbox's id range: files owned by ids at or
	// beyond it are refused.
	MaxID int
	// Auth gives the credentials of a registry (nil: anonymous).
	Auth *Keychain
	// CAFiles are PEM files of extra CAs registries' certificates may
	// chain to, on top of the system's.
	CAFiles []string
	// Egress restricts the addresses a pull connects to (egress.go); nil:
	// none (an administrator's pull).
	Egress *Egress
}

// Importer pulls and imports images into the store.
type Importer struct {
	o      Options
	layers string
	refs   string
}

// New returns an Importer over o.Store.
func New(o Options) (*Importer, error) {
	if o.MaxSize <= 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.MaxManifest <= 0 {
		o.MaxManifest = DefaultMaxManifest
	}
	if o.MaxID <= 0 {
		o.MaxID = DefaultMaxID
	}
	im := &Importer{o: o, layers: filepath.Join(o.Store.Dir(), "layers"), refs: filepath.Join(o.Store.Dir(), "refs")}
	for _, d := range []string{im.layers, im.refs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	im.removeAbandoned()
	return im, nil
}

// abandonedAfter is how old a spool file (a layer being pulled, an upload,
// an unpacked layout) must be to count as left by a daemon that died: no
// pull or import runs that long, and an Importer is made per operation,
// so younger ones may belong to one running now.
const abandonedAfter = 24 * time.Hour

// removeAbandoned deletes spool files crashed daemons left beside the
// layer store, and the intermediate images of builds they were running.
func (im *Importer) removeAbandoned() { _, _ = im.removeSpools(abandonedAfter) }

// spoolPrefixes start the names of the files and directories a pull,
// import or build keeps while it runs: in the layer store, layers being
// pulled (.partial-, .partial-blob-), uploads (.upload-), unpacked layouts
// (.import-) and build contexts (.context-); in refs/ and the build cache,
// records being written (.new suffix, .tmp- prefix).
var spoolPrefixes = []string{".partial-", ".upload-", ".import-", ".context-"}

// removeSpools deletes the spool files and the builds' intermediate
// images older than minAge, and returns what it removed (paths relative
// to the image store).
func (im *Importer) removeSpools(minAge time.Duration) ([]string, error) {
	var removed []string
	var errs []error
	old := func(fi os.FileInfo, err error) bool { return err == nil && time.Since(fi.ModTime()) >= minAge }
	if imgs, err := im.o.Store.List(); err == nil {
		for _, img := range imgs {
			if strings.HasPrefix(img.Name, IntermediatePrefix) && time.Since(img.BuiltAt) >= minAge {
				if err := im.o.Store.Remove(img.Name); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, "by-name/"+img.Name)
			}
		}
	}
	for _, d := range []struct {
		dir   string
		spool func(string) bool
	}{
		{im.layers, func(n string) bool {
			return slices.ContainsFunc(spoolPrefixes, func(p string) bool { return strings.HasPrefix(n, p) })
		}},
		{im.refs, func(n string) bool { return strings.HasSuffix(n, ".new") }},
		{im.cacheDir(), func(n string) bool { return strings.HasPrefix(n, ".tmp-") }},
	} {
		entries, _ := os.ReadDir(d.dir)
		for _, e := range entries {
			if !d.spool(e.Name()) || !old(e.Info()) {
				continue
			}
			p := filepath.Join(d.dir, e.Name())
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
				continue
			}
			rel, _ := filepath.Rel(im.o.Store.Dir(), p)
			removed = append(removed, rel)
		}
	}
	return removed, errors.Join(errs...)
}

// Progress receives the phases of a pull or import.
type Progress func(apitypes.ImageProgress)

// source says how to read an image's layers: from a registry or an OCI
// layout, compressed and checked against their digests; from a docker
// save archive, uncompressed, checked against their diff ids.
type source int

const (
	fromCompressed source = iota
	fromUncompressed
)

// install stores img (already resolved to linux/amd64) under its config
// digest with references refs.
func (im *Importer) install(ctx context.Context, img v1.Image, src source, refs []string, manifestDigest string, progress Progress) (*image.Image, error) {
	if progress == nil {
		progress = func(apitypes.ImageProgress) {}
	}
	cfg, configHex, err := im.readConfig(img, src)
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, im.sourceError("layers", err)
	}
	info, err := ociInfo(cfg, configHex, len(layers), refs, manifestDigest)
	if err != nil {
		return nil, err
	}
	rec := &image.Image{
		Name: NamePrefix + configHex[:12], Digest: configHex, Env: envMap(cfg.Config.Env), OCI: info,
	}
	progress(apitypes.ImageProgress{Phase: "resolved", Image: rec.Name, Digest: info.ConfigDigest, Layers: len(layers)})
	run := &installRun{im: im, src: src, rec: rec, cfg: cfg, layers: layers, progress: progress}
	defer run.removePartials()
	out, err := im.o.Store.InstallTree(ctx, rec, func(rootfs string) error { return run.fill(ctx, rootfs) })
	if err != nil {
		return nil, err
	}
	// The tree is complete: the layers it was made of join the layer
	// store under their diff ids.
	for i, p := range run.partials {
		if err := os.Rename(p.tmp, filepath.Join(im.layers, p.diffID)); err != nil {
			return nil, fmt.Errorf("store layer: %w", err)
		}
		run.partials[i].tmp = ""
	}
	for _, r := range refs {
		if err := im.setRef(r, out.Name); err != nil {
			return nil, err
		}
	}
	progress(apitypes.ImageProgress{Phase: "done", Image: out.Name, Digest: info.ConfigDigest, Layers: len(layers), Bytes: out.SizeBytes})
	return out, nil
}

// readConfig reads img's config within images.max_manifest_size, checks
// it against the manifest's digest (a compressed source's) and its
// platform, and returns it with its hex sha256.
func (im *Importer) readConfig(img v1.Image, src source) (*v1.ConfigFile, string, error) {
	mf, err := img.Manifest()
	if err != nil {
		return nil, "", im.sourceError("manifest", err)
	}
	if mf.Config.Size > im.o.MaxManifest {
		return nil, "", errdefs.LimitExceededf("image: config %s: %d bytes, over images.max_manifest_size (%d)", mf.Config.Digest, mf.Config.Size, im.o.MaxManifest)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, "", im.sourceError("config", err)
	}
	if int64(len(raw)) > im.o.MaxManifest {
		return nil, "", errdefs.LimitExceededf("image: config: %d bytes, over images.max_manifest_size (%d)", len(raw), im.o.MaxManifest)
	}
	sum := sha256.Sum256(raw)
	configHex := hex.EncodeToString(sum[:])
	if src == fromCompressed && mf.Config.Digest.Hex != configHex {
		return nil, "", errdefs.Invalidf("image: config: digest mismatch: manifest names sha256:%s, content is sha256:%s", mf.Config.Digest.Hex, configHex)
	}
	var cfg v1.ConfigFile
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, "", errdefs.Invalidf("image: config: malformed: %v", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" || cfg.Architecture != "" && cfg.Architecture != "amd64" {
		return nil, "", errdefs.Invalidf("image: config: platform %s/%s: only linux/amd64 images run here", cfg.OS, cfg.Architecture)
	}
	return &cfg, configHex, nil
}

// ociInfo is what the store keeps of an image's config, after checking
// that its diff ids are as many as the manifest's layers (nlayers, at most
// maxLayers) and sha256 digests.
func ociInfo(cfg *v1.ConfigFile, configHex string, nlayers int, refs []string, manifestDigest string) (*image.OCIInfo, error) {
	diffIDs := cfg.RootFS.DiffIDs
	if nlayers != len(diffIDs) {
		return nil, errdefs.Invalidf("image: manifest has %d layers, config rootfs.diff_ids %d", nlayers, len(diffIDs))
	}
	if nlayers > maxLayers {
		return nil, errdefs.LimitExceededf("image: %d layers, at most %d", nlayers, maxLayers)
	}
	info := &image.OCIInfo{
		References: refs, ManifestDigest: manifestDigest, ConfigDigest: "sha256:" + configHex,
		WorkingDir: cfg.Config.WorkingDir, ConfigUser: cfg.Config.User,
		Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd,
	}
	for _, d := range diffIDs {
		if d.Algorithm != "sha256" || !isHex64(d.Hex) {
			return nil, errdefs.Invalidf("image: config: rootfs.diff_ids: %q is not a sha256 digest", d.String())
		}
		info.Layers = append(info.Layers, d.String())
	}
	return info, nil
}

// installRun is one install's tree being filled: the layers read from
// their source (partials), removed unless install moved them into the
// layer store.
type installRun struct {
	im       *Importer
	src      source
	rec      *image.Image
	cfg      *v1.ConfigFile
	layers   []v1.Layer
	progress Progress
	partials []partialLayer
}

func (run *installRun) removePartials() {
	for _, p := range run.partials {
		if p.tmp != "" {
			os.Remove(p.tmp)
		}
	}
}

// fill unpacks the layers into rootfs (the store's new tree) and resolves
// the image's user in it.
func (run *installRun) fill(ctx context.Context, rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	im, diffIDs, rec := run.im, run.cfg.RootFS.DiffIDs, run.rec
	b := &budget{left: im.o.MaxSize, max: im.o.MaxSize}
	var ahead []*prefetch
	if run.src == fromCompressed {
		var stop func()
		ahead, stop = im.startPrefetch(ctx, run.layers, diffIDs)
		defer stop()
	}
	for i, l := range run.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := fmt.Sprintf("%d (%s)", i, diffIDs[i])
		ev := apitypes.ImageProgress{Phase: "layer", Image: rec.Name, Layer: diffIDs[i].String(), Index: i, Layers: len(run.layers)}
		var pf *prefetch
		if ahead != nil {
			pf = ahead[i]
		}
		partial, err := im.applyOne(ctx, root, l, run.src, diffIDs[i], name, b, &ev, pf)
		if partial != "" {
			run.partials = append(run.partials, partialLayer{tmp: partial, diffID: diffIDs[i].Hex})
		}
		if err != nil {
			return err
		}
		run.progress(ev)
	}
	if rec.User, err = resolveUser(root, run.cfg.Config.User, im.o.MaxID); err != nil {
		return err
	}
	// As a container runtime would, from the image's account.
	for k, v := range map[string]string{"HOME": rec.User.Home, "USER": rec.User.Name} {
		if _, ok := rec.Env[k]; !ok && v != "" {
			rec.Env[k] = v
		}
	}
	return nil
}

// partialLayer is a layer read from its source during an install, not
// yet in the layer store.
type partialLayer struct{ tmp, diffID string }

// applyOne unpacks layer l onto root: from the layer store when its diff
// id is stored, else from its source, kept beside the layer store (the
// returned partial file, which install renames into the store once the
// whole image is in).
//
// pf, if not nil, is the layer's blob being fetched ahead (prefetch.go):
// it is read from its spool file once fetched.
func (im *Importer) applyOne(ctx context.Context, root *os.Root, l v1.Layer, src source, diffID v1.Hash, name string, b *budget, ev *apitypes.ImageProgress, pf *prefetch) (partial string, err error) {
	stored := filepath.Join(im.layers, diffID.Hex)
	if f, err := os.Open(stored); err == nil {
		defer f.Close()
		ev.Cached = true
		fi, _ := f.Stat()
		ev.Bytes = fi.Size()
		return "", applyLayer(root, &countingReader{r: bufio.NewReaderSize(f, 1<<20), b: b}, name, b, im.o.MaxID)
	}
	rc, wantBlob, err := im.openLayer(ctx, l, src, pf, name)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	blobHash := sha256.New()
	blob := io.TeeReader(rc, blobHash)
	var data io.Reader = blob
	if src == fromCompressed {
		if data, err = decompress(bufio.NewReaderSize(blob, 1<<20)); err != nil {
			return "", errdefs.Invalidf("image: layer %s: %v", name, err)
		}
	}
	f, err := os.CreateTemp(im.layers, ".partial-")
	if err != nil {
		return "", err
	}
	partial = f.Name()
	diffHash := sha256.New()
	cr := &countingReader{r: io.TeeReader(data, io.MultiWriter(f, diffHash)), b: b}
	applyErr := im.applyToEnd(root, cr, blob, name, b)
	if cerr := f.Close(); applyErr == nil && cerr != nil {
		applyErr = cerr
	}
	if applyErr == nil && src == fromCompressed && wantBlob.Hex != hex.EncodeToString(blobHash.Sum(nil)) {
		applyErr = errdefs.Invalidf("image: layer %s: digest mismatch: manifest names %s, blob is sha256:%s", name, wantBlob, hex.EncodeToString(blobHash.Sum(nil)))
	}
	if got := hex.EncodeToString(diffHash.Sum(nil)); applyErr == nil && got != diffID.Hex {
		applyErr = errdefs.Invalidf("image: layer %s: diff id mismatch: config names %s, content is sha256:%s", name, diffID, got)
	}
	if applyErr != nil {
		os.Remove(partial)
		return "", applyErr
	}
	ev.Bytes = cr.n
	return partial, nil
}

// openLayer opens layer l's bytes as its source gives them: uncompressed
// (a docker save archive), else its compressed blob, from the prefetch's
// spool file once fetched when pf is not nil. wantBlob is the blob's
// digest (compressed sources only). A failed prefetch's error and the
// context's are returned as they are, the source's as a source error.
func (im *Importer) openLayer(ctx context.Context, l v1.Layer, src source, pf *prefetch, name string) (rc io.ReadCloser, wantBlob v1.Hash, err error) {
	switch {
	case src == fromUncompressed:
		rc, err = l.Uncompressed()
	case pf != nil:
		select {
		case <-pf.done:
		case <-ctx.Done():
			return nil, wantBlob, ctx.Err()
		}
		if pf.err != nil {
			return nil, wantBlob, pf.err
		}
		if wantBlob, err = l.Digest(); err == nil {
			rc, err = os.Open(pf.path)
		}
	default:
		if wantBlob, err = l.Digest(); err == nil {
			rc, err = l.Compressed()
		}
	}
	if err != nil {
		return nil, wantBlob, im.sourceError("layer "+name, err)
	}
	return rc, wantBlob, nil
}

// applyToEnd unpacks the layer cr reads onto root, then reads both the
// layer and its blob to their ends: whatever follows the tar's end still
// counts against the budget and is hashed, and the blob's digest is only
// known at its end.
func (im *Importer) applyToEnd(root *os.Root, cr *countingReader, blob io.Reader, name string, b *budget) error {
	if err := applyLayer(root, cr, name, b, im.o.MaxID); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		if errors.Is(err, errBudget) {
			return errdefs.LimitExceededf("image: layer %s: after the last entry: unpacked image exceeds images.max_size (%d bytes)", name, b.max)
		}
		return errdefs.Invalidf("image: layer %s: %v", name, err)
	}
	if _, err := io.Copy(io.Discard, blob); err != nil {
		return im.sourceError("layer "+name, err)
	}
	return nil
}

// decompress detects the layer's compression by its magic number (a
// media type can lie; the bytes cannot): gzip, zstd or none.
func decompress(r *bufio.Reader) (io.Reader, error) {
	magic, err := r.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return gzip.NewReader(r)
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The window cap bounds the decoder's memory, whatever a frame
		// header claims.
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	default:
		return r, nil
	}
}

// sourceError classes an error of the registry or archive: a refused
// credential or a missing image is the caller's to fix; a digest that
// go-containerregistry found wrong is a hostile or broken source.
func (im *Importer) sourceError(what string, err error) error {
	if errors.As(err, new(*errdefs.Error)) {
		return err
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "UNAUTHORIZED") || strings.Contains(msg, "DENIED") || strings.Contains(msg, "401 Unauthorized"):
		return errdefs.New(errdefs.PermissionDenied, "image: %s: the registry refused the credentials: %v", what, err)
	case strings.Contains(msg, "MANIFEST_UNKNOWN") || strings.Contains(msg, "NAME_UNKNOWN") || strings.Contains(msg, "404 Not Found"):
		return errdefs.NotFoundf("image: %s: %v", what, err)
	case strings.Contains(msg, "error verifying") || strings.Contains(msg, "does not match") || strings.Contains(msg, "digest mismatch"):
		return errdefs.Invalidf("image: %s: digest mismatch: %v", what, err)
	case errors.Is(err, errTooLarge):
		return errdefs.LimitExceededf("image: %s: %v", what, err)
	}
	return errdefs.Wrap(errdefs.Unavailable, err, "image: %s", what)
}

// envMap turns a config's KEY=VALUE list into the store's map.
func envMap(env []string) map[string]string {
	out := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			out[k] = v
		}
	}
	return out
}

// resolveUser turns the config's User (name or id, optionally :group)
// into the account commands run as, through the image's own /etc/passwd
// and /etc/group (read inside the tree, never the host's).
func resolveUser(root *os.Root, spec string, maxID int) (image.UserSpec, error) {
	u := image.UserSpec{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/sh"}
	if spec == "" {
		return u, nil
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	passwd, _ := root.ReadFile("etc/passwd")
	found := false
	for _, line := range strings.Split(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 {
			continue
		}
		if f[0] == user || f[2] == user {
			uid, err1 := strconv.Atoi(f[2])
			gid, err2 := strconv.Atoi(f[3])
			if err1 != nil || err2 != nil {
				continue
			}
			u = image.UserSpec{Name: f[0], UID: uid, GID: gid, Home: f[5], Shell: f[6]}
			found = true
			break
		}
	}
	if !found {
		uid, err := strconv.Atoi(user)
		if err != nil {
			return u, errdefs.Invalidf("image: config: User %q: no such user in the image's /etc/passwd", spec)
		}
		u = image.UserSpec{Name: user, UID: uid, GID: uid, Home: "/", Shell: "/bin/sh"}
	}
	if hasGroup {
		gid, err := strconv.Atoi(group)
		if err != nil {
			gid = -1
			groups, _ := root.ReadFile("etc/group")
			for _, line := range strings.Split(string(groups), "\n") {
				f := strings.Split(line, ":")
				if len(f) >= 3 && f[0] == group {
					gid, _ = strconv.Atoi(f[2])
				}
			}
			if gid < 0 {
				return u, errdefs.Invalidf("image: config: User %q: no such group in the image's /etc/group", spec)
			}
		}
		u.GID = gid
	}
	if u.UID < 0 || u.UID >= maxID || u.GID < 0 || u.GID >= maxID {
		return u, errdefs.Invalidf("image: config: User %q: id outside the sandbox's id range 0-%d", spec, maxID-1)
	}
	return u, nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// ParseReference parses an image reference as clients write it
// ("registry.example:5000/team/python:3.12", "...@sha256:..."); field
// names it in errors.
func ParseReference(field, ref string) (name.Reference, error) {
	if ref == "" {
		return nil, errdefs.Invalidf("%s: required", field)
	}
	if len(ref) > 512 {
		return nil, errdefs.Invalidf("%s: %d bytes, at most 512", field, len(ref))
	}
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		// StrictValidation wants a tag or digest; a bare name means :latest.
		if r, err = name.ParseReference(ref); err != nil {
			return nil, errdefs.Invalidf("%s: malformed image reference %q: %v", field, ref, err)
		}
	}
	return r, nil
}

// IsReference reports whether s is an image reference rather than the
// name of an image of the store (those have no '/', ':' or '@').
func IsReference(s string) bool { return strings.ContainsAny(s, "/:@.") }
