package images

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// OCI images: pulled from registries (image_pull, POST /v1/images/pull,
// sandboxctl images pull, and sandbox_create with a reference when
// images.allow_pull lets it), imported from archives. pkg/oci does the
// work and holds the trust boundary; this part applies the daemon's
// configuration to it.

// importer makes the pkg/oci importer from the configuration as it is
// now (credentials may change with a reload), for the caller ctx carries.
func (s *Service) importer(ctx context.Context) (*oci.Importer, error) {
	kc := &oci.Keychain{Registries: map[string]oci.Credential{}, DockerConfig: s.cfg.DockerConfig}
	var cas []string
	for _, r := range s.cfg.Registries {
		pw := r.Password
		if r.PasswordEnv != "" {
			pw = os.Getenv(r.PasswordEnv)
		}
		kc.Registries[r.Host] = oci.Credential{Username: r.Username, Password: pw, Token: r.Token}
		if r.CAFile != "" {
			cas = append(cas, r.CAFile)
		}
	}
	return oci.New(oci.Options{
		Store: s.images, MaxSize: int64(s.cfg.MaxSize), MaxManifest: int64(s.cfg.MaxManifestSize),
		MaxID: s.maxID, Auth: kc, CAFiles: cas, Egress: s.egress(ctx),
	})
}

// egress is the rule a pull for the caller ctx carries connects under.
//
// Security boundary: the daemon dials from the host, so a non-admin key
// (a tenant's) could otherwise make it connect to the host's loopback
// services, the cloud's metadata address or the site's private networks
// by naming them as a registry (or by a registry redirecting there). Its
// pulls connect only to public addresses, and to the registries the
// administrator named: images.registries (configured credentials mean the
// registry is meant to be used) and images.private_registries. Admin
// keys, the unix socket and the engine's own work (no principal) pull as
// before: they could reach those addresses anyway.
func (s *Service) egress(ctx context.Context) *oci.Egress {
	if p, ok := principal.From(ctx); !ok || p.Admin {
		return nil
	}
	e := &oci.Egress{Resolver: s.resolver}
	for _, r := range s.cfg.Registries {
		e.Allowed = append(e.Allowed, r.Host)
	}
	e.Allowed = append(e.Allowed, s.cfg.PrivateRegistries...)
	return e
}

// pulls keeps one pull per reference at a time; later callers wait for it.
type pulls struct {
	mu      sync.Mutex
	running map[string]chan struct{}
}

// Pull fetches ref from its registry into the store (image_pull,
// POST /v1/images/pull).
func (s *Service) Pull(ctx context.Context, ref string, progress oci.Progress) (*apitypes.Image, error) {
	return s.pull(ctx, "reference", ref, progress)
}

// pull is Pull with field naming ref in errors.
func (s *Service) pull(ctx context.Context, field, ref string, progress oci.Progress) (*apitypes.Image, error) {
	if _, err := oci.ParseReference(field, ref); err != nil {
		return nil, err
	}
	defer s.useLayers()()
	im, err := s.importer(ctx)
	if err != nil {
		return nil, err
	}
	s.pulls.mu.Lock()
	if s.pulls.running == nil {
		s.pulls.running = map[string]chan struct{}{}
	}
	for {
		ch, busy := s.pulls.running[ref]
		if !busy {
			break
		}
		s.pulls.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "image %s: still being pulled", ref)
		}
		s.pulls.mu.Lock()
	}
	done := make(chan struct{})
	s.pulls.running[ref] = done
	s.pulls.mu.Unlock()
	defer func() {
		s.pulls.mu.Lock()
		delete(s.pulls.running, ref)
		s.pulls.mu.Unlock()
		close(done)
	}()
	img, err := im.Pull(ctx, field, ref, progress)
	if err != nil {
		return nil, err
	}
	return s.Described(ctx, img)
}

// Import installs the image of the archive at path (docker save, or an OCI
// layout directory or tar); ref picks one of several images in it.
func (s *Service) Import(ctx context.Context, path, ref string, progress oci.Progress) (*apitypes.Image, error) {
	defer s.useLayers()()
	im, err := s.importer(ctx)
	if err != nil {
		return nil, err
	}
	img, err := im.Import(ctx, path, ref, progress)
	if err != nil {
		return nil, err
	}
	return s.Described(ctx, img)
}

// ImportFrom is Import of an archive read from r (an upload): a docker
// save tar or a tar of an OCI layout, at most images.max_size bytes. It is
// spooled beside the layer store and removed once imported.
func (s *Service) ImportFrom(ctx context.Context, r io.Reader, ref string, progress oci.Progress) (*apitypes.Image, error) {
	// In flight from the spool file on: a prune meanwhile would take it
	// for a crash's.
	defer s.useLayers()()
	dir := filepath.Join(s.images.Dir(), "layers")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "spool upload")
	}
	f, err := os.CreateTemp(dir, ".upload-")
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "spool upload")
	}
	defer os.Remove(f.Name())
	max := int64(s.cfg.MaxSize)
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "file: upload")
	}
	if n > max {
		return nil, errdefs.LimitExceededf("file: archive over images.max_size (%d bytes)", max)
	}
	if n == 0 {
		return nil, errdefs.Invalidf("file: empty upload")
	}
	return s.Import(ctx, f.Name(), ref, progress)
}

// Pulled returns the store name of the image reference ref was pulled or
// imported as, without pulling: failed_precondition naming field when it
// was not (the template pool's refills, which run for no caller, so
// under no caller's pull rules, use it).
func (s *Service) Pulled(field, ref string) (string, error) {
	im, err := s.importer(context.Background())
	if err != nil {
		return "", err
	}
	if _, err := oci.ParseReference(field, ref); err != nil {
		return "", err
	}
	local, err := im.Lookup(ref)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "%s: look up %s", field, ref)
	}
	if local == "" {
		return "", errdefs.FailedPreconditionf("%s: image %q is not pulled (a sandbox_create of it pulls it, or image_pull)", field, ref)
	}
	return local, nil
}

// Resolve returns the store name of the image field names: a store name
// as it is; a reference (registry/name:tag) as the image it was pulled or
// imported as, pulled now when it never was and images.allow_pull lists
// its registry.
func (s *Service) Resolve(ctx context.Context, field, name string, progress oci.Progress) (string, error) {
	if !oci.IsReference(name) {
		return name, nil
	}
	im, err := s.importer(ctx)
	if err != nil {
		return "", err
	}
	r, err := oci.ParseReference(field, name)
	if err != nil {
		return "", err
	}
	if local, err := im.Lookup(name); err != nil || local != "" {
		return local, err
	}
	host := r.Context().RegistryStr()
	if !slices.Contains(s.cfg.AllowPull, "*") && !slices.Contains(s.cfg.AllowPull, host) {
		return "", errdefs.Invalidf("%s: image %q is not pulled, and images.allow_pull does not let sandbox_create pull from %s (pull it first: image_pull)", field, name, host)
	}
	img, err := s.pull(ctx, field, name, progress)
	if err != nil {
		return "", err
	}
	return img.Name, nil
}
