package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// Credential is what a registry is logged in with: a user and password
// (basic, or exchanged for a bearer token when the registry asks for
// one), or a token given as is.
type Credential struct {
	Username, Password string
	Token              string // an identity (refresh) token
}

// Keychain gives go-containerregistry the credentials of a registry: the
// daemon's own configuration first, then a Docker config.json.
type Keychain struct {
	Registries map[string]Credential // by host[:port]
	// DockerConfig is the path of a Docker config.json; "" for none.
	DockerConfig string
}

// Resolve implements authn.Keychain.
func (k *Keychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if k == nil {
		return authn.Anonymous, nil
	}
	host := res.RegistryStr()
	if c, ok := k.Registries[host]; ok {
		return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.Token}), nil
	}
	if k.DockerConfig == "" {
		return authn.Anonymous, nil
	}
	data, err := os.ReadFile(k.DockerConfig)
	if err != nil {
		return nil, fmt.Errorf("images.docker_config: %w", err)
	}
	var cf struct {
		Auths map[string]struct {
			Auth          string `json:"auth"`
			Username      string `json:"username"`
			Password      string `json:"password"`
			IdentityToken string `json:"identitytoken"`
			RegistryToken string `json:"registrytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &cf); err != nil {
		return nil, fmt.Errorf("images.docker_config %s: %w", k.DockerConfig, err)
	}
	for key, a := range cf.Auths {
		// Docker writes "https://host/v1/" for its own hub and "host"
		// for others.
		h := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
		h, _, _ = strings.Cut(h, "/")
		if h != host && !(host == name.DefaultRegistry && h == "index.docker.io") {
			continue
		}
		cfg := authn.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
		if a.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("images.docker_config: auths[%q].auth: not base64", key)
			}
			cfg.Username, cfg.Password, _ = strings.Cut(string(raw), ":")
		}
		return authn.FromConfig(cfg), nil
	}
	return authn.Anonymous, nil
}

// errTooLarge is what a manifest over the cap reads as.
var errTooLarge = errors.New("manifest over images.max_manifest_size")

// capTransport cuts manifests (and indexes) short at max bytes:
// go-containerregistry's own cap is 100 MiB.
type capTransport struct {
	next http.RoundTripper
	max  int64
}

func (t *capTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	if resp.ContentLength > t.max {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %d bytes: %w (%d)", req.URL.Path, resp.ContentLength, errTooLarge, t.max)
	}
	resp.Body = &capBody{ReadCloser: resp.Body, left: t.max, path: req.URL.Path}
	return resp, nil
}

type capBody struct {
	io.ReadCloser
	left int64
	path string
}

func (b *capBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, fmt.Errorf("%s: %w", b.path, errTooLarge)
	}
	return n, err
}

// transport is the HTTP client's: the system's CAs and the configured
// ones (TLS, but go-containerregistry falls back to plain HTTP for a
// registry named by a loopback, localhost, .local or RFC 1918 host),
// bounded waits, and for a restricted pull (Options.Egress) the
// dialer that holds every connection to the egress rule (egress.go),
// returned so that the pull can report its refusal.
func (im *Importer) transport() (http.RoundTripper, *egressDialer, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, f := range im.o.CAFiles {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, errdefs.Invalidf("images.registries: ca_file: %v", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, errdefs.Invalidf("images.registries: ca_file %s: no PEM certificate", f)
		}
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.Proxy = nil // registries are reached directly, never through the host's proxy settings
	base.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	base.ResponseHeaderTimeout = time.Minute
	var dialer *egressDialer
	if im.o.Egress != nil {
		dialer = newEgressDialer(im.o.Egress)
		base.DialContext = dialer.DialContext
	}
	return &capTransport{next: base, max: im.o.MaxManifest}, dialer, nil
}

// amd64 is the only platform sandboxes run.
var amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}

// Pull fetches ref from its registry (an index resolves to linux/amd64)
// and installs it; progress sees its phases. field names ref in errors
// ("reference", "image", "FROM").
func (im *Importer) Pull(ctx context.Context, field, ref string, progress Progress) (*image.Image, error) {
	r, err := ParseReference(field, ref)
	if err != nil {
		return nil, err
	}
	tr, dialer, err := im.transport()
	if err != nil {
		return nil, err
	}
	img, err := im.pull(ctx, r, tr, progress)
	if err != nil {
		// A refused connection is the cause, however the HTTP client
		// and go-containerregistry wrapped it.
		if rerr := dialer.refusal(field, r.Context().RegistryStr()); rerr != nil {
			return nil, rerr
		}
		return nil, err
	}
	return img, nil
}

func (im *Importer) pull(ctx context.Context, r name.Reference, tr http.RoundTripper, progress Progress) (*image.Image, error) {
	var kc authn.Keychain = authn.NewMultiKeychain()
	if im.o.Auth != nil {
		kc = im.o.Auth
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithAuthFromKeychain(kc), remote.WithPlatform(amd64)}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, im.sourceError("manifest of "+r.String(), err)
	}
	if desc.Size > im.o.MaxManifest || int64(len(desc.Manifest)) > im.o.MaxManifest {
		return nil, errdefs.LimitExceededf("image: manifest of %s: %d bytes, over images.max_manifest_size (%d)", r, len(desc.Manifest), im.o.MaxManifest)
	}
	img, err := desc.Image() // an index: its linux/amd64 image
	if err != nil {
		return nil, im.sourceError("manifest of "+r.String(), err)
	}
	md, err := img.Digest()
	if err != nil {
		return nil, im.sourceError("manifest of "+r.String(), err)
	}
	return im.install(ctx, img, fromCompressed, []string{canonical(r)}, md.String(), progress)
}

// Import installs the image in the archive at path: a `docker save` tar,
// an OCI image layout directory, or a tar of one. An archive holding
// several images takes the one tagged ref, or the only one.
func (im *Importer) Import(ctx context.Context, path, ref string, progress Progress) (*image.Image, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, errdefs.Invalidf("file: %v", err)
	}
	if fi.IsDir() {
		return im.importLayout(ctx, path, ref, progress)
	}
	kind, err := archiveKind(path)
	if err != nil {
		return nil, err
	}
	if kind == "oci-layout" {
		dir, err := os.MkdirTemp(im.layers, ".import-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if err := untarLayout(path, dir, im.o.MaxSize); err != nil {
			return nil, err
		}
		return im.importLayout(ctx, dir, ref, progress)
	}
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref)
		if err != nil {
			return nil, errdefs.Invalidf("reference: malformed tag %q: %v", ref, err)
		}
		tag = &t
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return nil, errdefs.Invalidf("file: not a docker save archive nor an OCI layout: %v", err)
	}
	if tag == nil && len(m) != 1 {
		return nil, errdefs.Invalidf("reference: the archive holds %d images; name the tag to import", len(m))
	}
	img, err := tarball.ImageFromPath(path, tag)
	if err != nil {
		return nil, errdefs.Invalidf("file: %v", err)
	}
	var refs []string
	for _, d := range m {
		if tag != nil && !containsTag(d.RepoTags, tag.String()) {
			continue
		}
		for _, t := range d.RepoTags {
			if r, err := name.ParseReference(t); err == nil {
				refs = append(refs, canonical(r))
			}
		}
	}
	return im.install(ctx, img, fromUncompressed, refs, "", progress)
}

func containsTag(tags []string, t string) bool {
	for _, x := range tags {
		if r, err := name.NewTag(x); err == nil && r.String() == t {
			return true
		}
	}
	return false
}

// archiveKind tells a docker save tar (manifest.json) from a tar of an OCI
// layout (oci-layout and index.json without manifest.json). Docker 25 and
// later write both files: those import as docker save archives.
func archiveKind(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", errdefs.Invalidf("file: %v", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", errdefs.Invalidf("file: not a tar archive: %v", err)
		}
		seen[strings.TrimPrefix(hdr.Name, "./")] = true
	}
	switch {
	case seen["manifest.json"]:
		return "docker", nil
	case seen["oci-layout"] && seen["index.json"]:
		return "oci-layout", nil
	}
	return "", errdefs.Invalidf("file: neither a docker save archive (manifest.json) nor an OCI layout (oci-layout, index.json)")
}

// untarLayout unpacks a tar of an OCI layout into dir: regular files and
// directories under blobs/ and the two top files only, at most max bytes.
func untarLayout(path, dir string, max int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.Invalidf("file: malformed tar: %v", err)
		}
		n, err := cleanName(hdr.Name)
		if err != nil {
			return errdefs.Invalidf("file: entry %q: %v", hdr.Name, err)
		}
		switch {
		case n == "" || hdr.Typeflag == tar.TypeDir:
			if n != "" {
				if err := root.MkdirAll(n, 0o700); err != nil {
					return err
				}
			}
			continue
		case hdr.Typeflag != tar.TypeReg:
			return errdefs.Invalidf("file: entry %q: only files and directories belong in an OCI layout", hdr.Name)
		case n != "oci-layout" && n != "index.json" && !strings.HasPrefix(n, "blobs/"):
			continue
		}
		if max -= hdr.Size; max < 0 {
			return errdefs.LimitExceededf("file: entry %q: archive exceeds images.max_size", hdr.Name)
		}
		if err := root.MkdirAll(filepath.Dir(n), 0o700); err != nil {
			return err
		}
		w, err := root.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return errdefs.Invalidf("file: entry %q: %v", hdr.Name, err)
		}
		_, err = io.Copy(w, io.LimitReader(tr, hdr.Size))
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// importLayout installs the image of an OCI layout: the manifest whose
// org.opencontainers.image.ref.name annotation matches ref, or the only
// one; an index resolves to linux/amd64.
func (im *Importer) importLayout(ctx context.Context, dir, ref string, progress Progress) (*image.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errdefs.Invalidf("file: not an OCI layout: %v", err)
	}
	img, refs, err := im.pickImage(idx, ref, 0)
	if err != nil {
		return nil, err
	}
	md, err := img.Digest()
	if err != nil {
		return nil, im.sourceError("manifest", err)
	}
	return im.install(ctx, img, fromCompressed, refs, md.String(), progress)
}

const refNameAnnotation = "org.opencontainers.image.ref.name"

func (im *Importer) pickImage(idx v1.ImageIndex, ref string, depth int) (v1.Image, []string, error) {
	if depth > 2 {
		return nil, nil, errdefs.Invalidf("file: indexes nested too deep")
	}
	mf, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, errdefs.Invalidf("file: index: %v", err)
	}
	var cands []v1.Descriptor
	for _, d := range mf.Manifests {
		if ref != "" && depth == 0 && d.Annotations[refNameAnnotation] != ref && !strings.HasSuffix(ref, ":"+d.Annotations[refNameAnnotation]) {
			continue
		}
		if d.Platform != nil && depth > 0 && !d.Platform.Satisfies(amd64) {
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) != 1 && depth == 0 {
		return nil, nil, errdefs.Invalidf("reference: the layout holds %d images matching %q; name one by its org.opencontainers.image.ref.name", len(cands), ref)
	}
	if len(cands) == 0 {
		return nil, nil, errdefs.Invalidf("file: no linux/amd64 image in the layout's index")
	}
	d := cands[0]
	if d.Size > im.o.MaxManifest {
		return nil, nil, errdefs.LimitExceededf("image: manifest %s: %d bytes, over images.max_manifest_size (%d)", d.Digest, d.Size, im.o.MaxManifest)
	}
	var refs []string
	if ref != "" {
		if r, err := name.ParseReference(ref); err == nil {
			refs = append(refs, canonical(r))
		}
	} else if n := d.Annotations[refNameAnnotation]; n != "" {
		if r, err := name.ParseReference(n); err == nil {
			refs = append(refs, canonical(r))
		}
	}
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, nil, errdefs.Invalidf("file: index %s: %v", d.Digest, err)
		}
		img, _, err := im.pickImage(child, "", depth+1)
		return img, refs, err
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, nil, errdefs.Invalidf("file: manifest %s: %v", d.Digest, err)
	}
	return img, refs, nil
}

// canonical is the form references are recorded and looked up in:
// registry/repository:tag or registry/repository@digest.
func canonical(r name.Reference) string { return r.Name() }

// refFile is where the image a reference names is recorded.
func (im *Importer) refFile(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return filepath.Join(im.refs, hex.EncodeToString(sum[:16]))
}

type refRecord struct {
	Reference string `json:"reference"`
	Image     string `json:"image"`
}

func (im *Importer) setRef(ref, imageName string) error {
	data, _ := json.Marshal(refRecord{Reference: ref, Image: imageName})
	tmp := im.refFile(ref) + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, im.refFile(ref))
}

// Lookup returns the store name of the image ref was pulled or imported
// as, or "" when it was not (or that image is gone).
func (im *Importer) Lookup(ref string) (string, error) {
	r, err := ParseReference("image", ref)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(im.refFile(canonical(r)))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var rec refRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.Reference != canonical(r) {
		return "", nil
	}
	if _, err := im.o.Store.Get(rec.Image); err != nil {
		return "", nil
	}
	return rec.Image, nil
}

// Registry is the host[:port] of ref, as images.allow_pull lists them.
func Registry(ref string) (string, error) {
	r, err := ParseReference("image", ref)
	if err != nil {
		return "", err
	}
	return r.Context().RegistryStr(), nil
}
