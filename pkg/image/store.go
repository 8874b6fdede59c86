// Package image builds, stores and layers the root filesystems sandboxes run
// on.
//
// A recipe (rootfs/<name>.yaml) names Debian packages, files and settings.
// The Builder turns it into a directory tree with mmdebstrap, then adds what
// every sandbox relies on: the unprivileged user, /workspace with input/ and
// output/, the /.sandboxd mount point for the agent, and neutral network
// files. The tree is stored under the digest of everything that went into
// it (see Builder), so an unchanged recipe is never rebuilt and a changed
// one never overwrites a tree that running sandboxes still use.
//
// Stored trees are read-only by convention: the daemon only uses them as
// overlay lower layers. PrepareLayers gives each sandbox its own writable
// upper layer, workspace and /tmp on one size-limited tmpfs.
//
// On-disk layout of a Store (normally <state_dir>/images):
//
//	<digest>/rootfs/       the tree
//	<digest>/image.json    metadata (Image)
//	<digest>/build.log     the build's output
//	by-name/<name>         symlink to the current <digest>
//	failed/<name>-<time>.log  logs of failed builds
//	.lock-<name>           flock serialising builds and removals of <name>
//	                       (present only while held, or left by a crash)
//	.build-<name>.*        builds in progress (removed if found stale)
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// ErrNotFound is returned (wrapped) when no image exists for a name. It
// carries the errdefs.NotFound code.
var ErrNotFound = errdefs.NotFoundf("image not found")

// Image is one built image as recorded in its image.json.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	// Rootfs is the absolute host path of the tree. It is derived from
	// where the image is stored, not read from image.json.
	Rootfs    string    `json:"rootfs"`
	BuiltAt   time.Time `json:"built_at"`
	SizeBytes int64     `json:"size_bytes"`
	// BuildSeconds is how long the build took.
	BuildSeconds float64 `json:"build_seconds"`
	Suite        string  `json:"suite"`
	Mirror       string  `json:"mirror"`
	Recipe       *Recipe `json:"recipe"`
	// Packages maps every installed package to its version, as dpkg
	// reports them in the built tree.
	Packages map[string]string   `json:"packages"`
	Env      map[string]string   `json:"env"`
	Commands map[string][]string `json:"commands"`
	User     UserSpec            `json:"user"`
	// OCI is set for an image pulled or imported as an OCI image
	// (InstallTree); Recipe is then nil.
	OCI *OCIInfo `json:"oci,omitempty"`
}

// Store is the directory of built images. Its methods are safe for use by
// several goroutines and processes at once.
type Store struct {
	dir string
}

const (
	byNameDir   = "by-name"
	failedDir   = "failed"
	imageJSON   = "image.json"
	buildLog    = "build.log"
	rootfsDir   = "rootfs"
	lockPrefix  = ".lock-"
	buildPrefix = ".build-"
	trashPrefix = ".trash-"
)

// OpenStore opens (creating if needed) the image store rooted at dir,
// normally <state_dir>/images.
func OpenStore(dir string) (*Store, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, d := range []string{dir, filepath.Join(dir, byNameDir), filepath.Join(dir, failedDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// Everything under the store is world-readable on purpose: trees are
	// lower layers of containers whose processes run as unprivileged users.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Get returns the current image for name.
func (s *Store) Get(name string) (*Image, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	target, err := os.Readlink(filepath.Join(s.dir, byNameDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, err)
	}
	img, err := s.lookup(filepath.Base(target))
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, err)
	}
	return img, nil
}

// GetDigest returns the image of name stored under digest, current or
// stale (an older build kept while sandboxes use it), or an error
// wrapping ErrNotFound once it is gone.
func (s *Store) GetDigest(name, digest string) (*Image, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	img, err := s.lookup(digest)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, err)
	}
	if img.Name != name {
		return nil, fmt.Errorf("image %q digest %s: %w", name, digest, ErrNotFound)
	}
	return img, nil
}

// List returns the current image of every name, sorted by name.
func (s *Store) List() ([]*Image, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, byNameDir))
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []*Image
	for _, e := range entries {
		if !nameRE.MatchString(e.Name()) {
			continue // a half-written link (see setCurrent)
		}
		img, err := s.Get(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // removed since ReadDir
		}
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// Remove deletes the image called name: its by-name link and every tree
// built for that name. The caller must make sure no sandbox still uses
// them; removing a lower layer under a mounted overlay breaks the sandbox.
func (s *Store) Remove(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	unlock, err := s.lock(context.Background(), name)
	if err != nil {
		return err
	}
	defer unlock()

	found := false
	switch err := os.Remove(filepath.Join(s.dir, byNameDir, name)); {
	case err == nil:
		found = true
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	digests, err := s.digestsOf(name)
	if err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	for _, d := range digests {
		if err := s.discard(name, filepath.Join(s.dir, d)); err != nil {
			return fmt.Errorf("remove image %q: %w", name, err)
		}
		found = true
	}
	if !found {
		return fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	return nil
}

// Stale lists the stored images that are not the current one of their
// name: trees of an older digest of a recipe, kept because sandboxes
// started on them may still run.
func (s *Store) Stale() ([]*Image, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []*Image
	for _, e := range entries {
		if !e.IsDir() || !isDigest(e.Name()) {
			continue
		}
		img, err := s.lookup(e.Name())
		if err != nil {
			continue // not a complete image
		}
		if cur, err := s.Get(img.Name); err == nil && cur.Digest == img.Digest {
			continue
		}
		out = append(out, img)
	}
	return out, nil
}

// RemoveDigest deletes the tree of name stored under digest unless it is
// name's current image. The caller must make sure no sandbox uses it.
func (s *Store) RemoveDigest(name, digest string) error {
	if !nameRE.MatchString(name) || !isDigest(digest) {
		return fmt.Errorf("image %q digest %q: %w", name, digest, ErrNotFound)
	}
	unlock, err := s.lock(context.Background(), name)
	if err != nil {
		return err
	}
	defer unlock()
	if cur, err := s.Get(name); err == nil && cur.Digest == digest {
		return fmt.Errorf("image %q digest %s is current", name, digest[:12])
	}
	img, err := s.lookup(digest)
	if err != nil {
		return err
	}
	if img.Name != name {
		return fmt.Errorf("image %q digest %s: %w", name, digest[:12], ErrNotFound)
	}
	return s.discard(name, filepath.Join(s.dir, digest))
}

// lookup loads the image stored under digest.
func (s *Store) lookup(digest string) (*Image, error) {
	if !isDigest(digest) {
		return nil, fmt.Errorf("digest %q: %w", digest, ErrNotFound)
	}
	dir := filepath.Join(s.dir, digest)
	data, err := os.ReadFile(filepath.Join(dir, imageJSON))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("digest %s: %w", digest, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("digest %s: %w", digest, err)
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, fmt.Errorf("digest %s: decode %s: %w", digest, imageJSON, err)
	}
	if img.Digest != digest {
		return nil, fmt.Errorf("digest %s: %s names digest %q", digest, imageJSON, img.Digest)
	}
	img.Rootfs = filepath.Join(dir, rootfsDir)
	return &img, nil
}

// digestsOf returns the stored digests whose image.json names name.
func (s *Store) digestsOf(name string) ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || !isDigest(e.Name()) {
			continue
		}
		img, err := s.lookup(e.Name())
		if err != nil {
			continue // not a complete image: nothing of name's
		}
		if img.Name == name {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// setCurrent points by-name/<name> at digest, atomically: readers see either
// the old or the new target, never a missing link.
func (s *Store) setCurrent(name, digest string) error {
	link := filepath.Join(s.dir, byNameDir, name)
	tmp := filepath.Join(s.dir, byNameDir, "."+name+".new")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Join("..", digest), tmp); err != nil {
		return fmt.Errorf("link image %q: %w", name, err)
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("link image %q: %w", name, err)
	}
	return nil
}

// discard removes a tree of name's: it first renames it out of the way so
// that it disappears at once from readers, then unmounts anything a crashed
// build left mounted inside it, and only then deletes it. The caller holds
// name's lock; if it dies half-way, removeStale finishes the job.
func (s *Store) discard(name, dir string) error {
	trash, err := os.MkdirTemp(s.dir, trashPrefix+name+".")
	if err != nil {
		return err
	}
	moved := filepath.Join(trash, filepath.Base(dir))
	if err := os.Rename(dir, moved); err != nil {
		os.Remove(trash)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := unmountAll(trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// lock takes the store's lock for name (an flock, so it also serialises
// builds in other processes) and returns its release function. Waiting
// polls so that ctx can end it.
//
// The lock file lives only while the lock is held: release unlinks it
// before closing, so a refused or finished install leaves no file behind.
// A waiter may meanwhile hold the unlinked file open; once it gets the
// flock it checks that the path still names the file it locked, and
// starts over with a new one when not, so two holders never exist at
// once. A lock file left on disk is a crashed holder's (the flock died
// with it): RemoveDebris removes it.
func (s *Store) lock(ctx context.Context, name string) (func(), error) {
	for {
		f, err := s.tryLock(name)
		if err != nil {
			return nil, fmt.Errorf("lock image %q: %w", name, err)
		}
		if f != nil {
			path := f.Name()
			return func() {
				os.Remove(path)
				f.Close() // closing releases the flock
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock image %q: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tryLock takes name's lock without waiting: the locked file, or nil when
// another holder has it.
func (s *Store) tryLock(name string) (*os.File, error) {
	path := filepath.Join(s.dir, lockPrefix+name)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, nil
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			return f, nil
		}
		// The holder before us unlinked it: lock the path's new file.
		f.Close()
	}
}

// RemoveDebris removes what crashed builds, installs and removals left in
// the store: lock files no process holds, trees being built (.build-) and
// being removed (.trash-). A name whose lock is held is skipped: its
// holder is alive, and what it has in progress is its own. It returns the
// entries removed.
func (s *Store) RemoveDebris() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		for _, prefix := range []string{lockPrefix, buildPrefix, trashPrefix} {
			if rest, ok := strings.CutPrefix(n, prefix); ok {
				if prefix != lockPrefix {
					rest, _, _ = strings.Cut(rest, ".")
				}
				if nameRE.MatchString(rest) {
					names[rest] = true
				}
			}
		}
	}
	var errs []error
	for name := range names {
		f, err := s.tryLock(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f == nil {
			continue // held: a live build or install
		}
		if err := s.removeStale(name); err != nil {
			errs = append(errs, err)
		}
		// Unlinked before it is released, as lock's release does.
		os.Remove(f.Name())
		f.Close()
	}
	// What was there and is gone.
	var removed []string
	for _, e := range entries {
		if _, err := os.Lstat(filepath.Join(s.dir, e.Name())); errors.Is(err, os.ErrNotExist) {
			removed = append(removed, e.Name())
		}
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// removeStale deletes what crashed builds of name left behind. The caller
// holds name's lock, so no live build owns them.
func (s *Store) removeStale(name string) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		// "." cannot occur in a name, so ".build-py." never matches a
		// build of "py-3".
		stale := strings.HasPrefix(n, buildPrefix+name+".") || strings.HasPrefix(n, trashPrefix+name+".")
		if !stale || !e.IsDir() {
			continue
		}
		p := filepath.Join(s.dir, n)
		if err := unmountAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}

func isDigest(s string) bool {
	return len(s) == 64 && !slices.ContainsFunc([]byte(s), func(c byte) bool {
		return (c < '0' || c > '9') && (c < 'a' || c > 'f')
	})
}
