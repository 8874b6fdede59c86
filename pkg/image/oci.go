package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// OCIInfo says where an image that was not built from a recipe came from
// (an OCI image pulled from a registry or imported from an archive) and
// what its configuration asks of a sandbox.
type OCIInfo struct {
	// References are the names the image was pulled or imported as
	// ("registry.example/team/python:3.12").
	References []string `json:"references"`
	// ManifestDigest is the digest of the manifest pulled ("" for an
	// import whose manifest differs from any registry's).
	ManifestDigest string `json:"manifest_digest,omitempty"`
	// ConfigDigest is the image id, sha256:<Image.Digest>.
	ConfigDigest string `json:"config_digest"`
	// Layers are the diff ids of the image's layers, bottom first; each
	// is stored once in the layer store whatever the number of images.
	Layers     []string `json:"layers"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// ConfigUser is the image config's User as written there; Image.User
	// is what it resolved to in the image's own /etc/passwd.
	ConfigUser string   `json:"config_user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// Labels are the config's labels (LABEL of a Dockerfile build).
	Labels map[string]string `json:"labels,omitempty"`
}

// InstallTree stores an image whose tree fill writes (an OCI image):
// img names it, its digest and metadata; fill receives the path of an
// empty directory to fill. The tree then gets what every sandbox relies on
// (an empty /dev, neutral network files, /workspace, the agent's mount
// point), is sized and moved under its digest, and becomes name's current
// image. An image already stored under the digest is reused, its
// References merged; fill is not called. On failure nothing of the tree
// remains.
func (s *Store) InstallTree(ctx context.Context, img *Image, fill func(rootfs string) error) (_ *Image, err error) {
	if !nameRE.MatchString(img.Name) || !isDigest(img.Digest) {
		return nil, fmt.Errorf("install image %q digest %q: malformed name or digest", img.Name, img.Digest)
	}
	unlock, err := s.lock(ctx, img.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := s.lookup(img.Digest); err == nil {
		if old.OCI != nil && img.OCI != nil {
			for _, r := range img.OCI.References {
				if !slices.Contains(old.OCI.References, r) {
					old.OCI.References = append(old.OCI.References, r)
				}
			}
			if err := writeImage(filepath.Join(s.dir, img.Digest), old); err != nil {
				return nil, err
			}
		}
		return old, s.setCurrent(img.Name, img.Digest)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err := s.removeStale(img.Name); err != nil {
		return nil, fmt.Errorf("install image %q: remove leftovers: %w", img.Name, err)
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(s.dir, buildPrefix+img.Name+".")
	if err != nil {
		return nil, fmt.Errorf("install image %q: %w", img.Name, err)
	}
	defer func() {
		if err != nil {
			if derr := s.discard(img.Name, tmp); derr != nil {
				err = errors.Join(err, fmt.Errorf("remove failed install: %w", derr))
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	root := filepath.Join(tmp, rootfsDir)
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	if err := fill(root); err != nil {
		return nil, err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return nil, err
	}
	if err := finaliseTree(root, img.User); err != nil {
		return nil, fmt.Errorf("install image %q: %w", img.Name, err)
	}
	if img.SizeBytes, err = diskSize(root); err != nil {
		return nil, err
	}
	img.BuiltAt = time.Now().UTC()
	img.BuildSeconds = time.Since(start).Seconds()
	img.Rootfs = filepath.Join(s.dir, img.Digest, rootfsDir)
	if err := writeImage(tmp, img); err != nil {
		return nil, err
	}
	if err := syncFS(tmp); err != nil {
		return nil, err
	}
	if err := s.install(img.Name, tmp, img.Digest); err != nil {
		return nil, err
	}
	return img, s.setCurrent(img.Name, img.Digest)
}

// Dir is the store's directory: other stores of image parts (OCI layers)
// live beside the trees.
func (s *Store) Dir() string { return s.dir }

// finaliseTree is finalise for a tree that came from elsewhere: the
// sandbox layout only. The image's own users and files stay as they are.
func finaliseTree(rootPath string, u UserSpec) error {
	root, err := os.OpenRoot(rootPath)
	if err != nil {
		return err
	}
	defer root.Close()
	r := &Recipe{User: u}
	for _, step := range []struct {
		what string
		do   func(*os.Root, *Recipe) error
	}{
		{"clear /dev", clearDev},
		{"create /etc", func(root *os.Root, _ *Recipe) error { return root.MkdirAll("etc", 0o755) }},
		{"write network files", writeNetworkFiles},
		{"create /tmp", func(root *os.Root, _ *Recipe) error {
			// Mkdir takes no sticky bit: set it after.
			if err := mkdir(root, "tmp", 0o755, 0, 0); err != nil {
				return err
			}
			return root.Chmod("tmp", fs.ModePerm|fs.ModeSticky)
		}},
		{"create sandbox directories", makeSandboxDirs},
	} {
		if err := step.do(root, r); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	return nil
}
