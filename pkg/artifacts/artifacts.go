// Package artifacts keeps exported archives of sandbox directories
// (files_export): <id>.tar.gz with <id>.json describing it, in one directory
// of the daemon's state, downloadable after the sandbox is gone and deleted
// by age.
//
// Archives hold user files and are written by the daemon (root): the files
// are 0600 in a 0700 directory. Ids are random and checked for shape before
// they reach a path, so a request cannot name a file outside the directory.
//
// An archive belongs to its sandbox's tenant, recorded beside it, since it
// outlives the sandbox: Open gives another tenant's caller the not_found of
// an id that does not exist (the id alone is not a capability).
package artifacts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// Artifact describes one archive.
type Artifact = apitypes.Artifact

// Store is the directory of archives.
type Store struct{ dir string }

// Open returns the store in dir, created on first write.
func Open(dir string) *Store { return &Store{dir: dir} }

// ValidID reports whether id has the shape of an artifact id.
func ValidID(id string) bool {
	if len(id) != len("art-")+16 || !strings.HasPrefix(id, "art-") {
		return false
	}
	_, err := hex.DecodeString(id[4:])
	return err == nil
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	return "art-" + hex.EncodeToString(b[:])
}

// Writer receives one archive's bytes. Commit keeps it; Abort (or a
// Commit that fails) removes it.
type Writer struct {
	s    *Store
	art  Artifact
	f    *os.File
	h    hash.Hash
	n    int64
	done bool
}

// Create starts a new archive of dir in sandbox sandboxID, owned by tenant
// (the sandbox's).
func (s *Store) Create(sandboxID, tenant, dir string) (*Writer, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("create artifacts dir: %w", err)
	}
	art := Artifact{ID: newID(), SandboxID: sandboxID, Tenant: tenant, Path: dir, CreatedAt: time.Now().UTC()}
	f, err := os.OpenFile(s.path(art.ID, ".tar.gz"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create artifact: %w", err)
	}
	return &Writer{s: s, art: art, f: f, h: sha256.New()}, nil
}

func (s *Store) path(id, ext string) string { return filepath.Join(s.dir, id+ext) }

// Write appends p to the archive.
func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("artifact: %w", err)
	}
	return n, nil
}

// Commit closes the archive and records its size and digest.
func (w *Writer) Commit() (*Artifact, error) {
	w.done = true
	err := w.f.Close()
	w.art.Size, w.art.SHA256 = w.n, hex.EncodeToString(w.h.Sum(nil))
	var meta []byte
	if err == nil {
		meta, err = json.Marshal(&w.art)
	}
	if err == nil {
		err = os.WriteFile(w.s.path(w.art.ID, ".json"), meta, 0o600)
	}
	if err != nil {
		_ = os.Remove(w.s.path(w.art.ID, ".tar.gz"))
		return nil, fmt.Errorf("record artifact: %w", err)
	}
	art := w.art
	return &art, nil
}

// Abort removes an archive that was not committed; it is a no-op after
// Commit, so it can be deferred.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	_ = w.f.Close()
	_ = os.Remove(w.s.path(w.art.ID, ".tar.gz"))
}

// Open opens an archive for reading, if ctx's caller may see it: callers
// without a principal (the engine's own work) and admins see all, a
// tenant's key its tenant's only (an archive recorded without a tenant,
// made before tenants, is the administrator's).
func (s *Store) Open(ctx context.Context, id string) (*Artifact, io.ReadCloser, error) {
	if !ValidID(id) {
		return nil, nil, errdefs.Invalidf("artifact_id: malformed %q", id)
	}
	notFound := errdefs.NotFoundf("artifact_id: no artifact %q", id)
	meta, err := os.ReadFile(s.path(id, ".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, notFound
	}
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "read artifact %s", id)
	}
	var art Artifact
	if err := json.Unmarshal(meta, &art); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "decode artifact %s", id)
	}
	if p, ok := principal.From(ctx); ok && !p.Admin && p.Tenant != art.Tenant {
		return nil, nil, notFound // the same answer as for no archive
	}
	f, err := os.Open(s.path(id, ".tar.gz"))
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "open artifact %s", id)
	}
	return &art, f, nil
}

// Prune deletes archives older than maxAge (0: keep all) and returns how
// many files it deleted.
func (s *Store) Prune(maxAge time.Duration) int {
	ents, err := os.ReadDir(s.dir)
	if err != nil || maxAge <= 0 {
		return 0
	}
	n := 0
	for _, ent := range ents {
		fi, err := ent.Info()
		if err == nil && time.Since(fi.ModTime()) > maxAge && os.Remove(filepath.Join(s.dir, ent.Name())) == nil {
			n++
		}
	}
	return n
}
