package images

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// loopbackResolver points testenv.RegistryName at 127.0.0.1.
type loopbackResolver struct{}

func (loopbackResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == testenv.RegistryName {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestTenantPullRules: a non-admin key's pulls (image_pull, and the
// resolution sandbox_create, template_create and FROM share) of a
// registry on loopback are refused, naming the field and the address,
// and leave nothing in the store; the registry named in
// images.private_registries or images.registries is pulled from; an
// admin key and the engine's own work are not restricted.
func TestTenantPullRules(t *testing.T) {
	testenv.RequireRoot(t) // layers' owners are set with chown
	reg := testenv.NewRegistry(t, false)
	img := testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "etc/marker", Body: "tenant"}), Comp: "gzip"}}, testenv.OCIImageOpts{})
	ref := reg.Push(t, reg.Ref("tenant/small:1"), img).String()
	_, port, _ := net.SplitHostPort(reg.Host)
	named := testenv.RegistryName + ":" + port + "/tenant/small:1"

	s := newService(t)
	s.cfg.AllowPull = []string{"*"}
	s.cfg.Registries = []config.Registry{{Host: "registry.example", CAFile: reg.CAFile}} // its CA serves every host
	s.resolver = loopbackResolver{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tenant := principal.With(ctx, principal.Principal{KeyID: "key-u", KeyName: "user", Tenant: "team-a"})

	for _, c := range []struct{ field, ref, host string }{
		{"reference", ref, reg.Host}, {"image", ref, reg.Host}, {"FROM", named, testenv.RegistryName},
	} {
		var err error
		if c.field == "reference" {
			_, err = s.Pull(tenant, c.ref, nil)
		} else {
			_, err = s.Resolve(tenant, c.field, c.ref, nil)
		}
		if errdefs.CodeOf(err) != errdefs.PermissionDenied || !strings.HasPrefix(errdefs.MessageOf(err), c.field+": registry "+c.host) || !strings.Contains(err.Error(), "127.0.0.1, a loopback address") {
			t.Fatalf("tenant's %s %s: %v, want permission_denied naming %s and 127.0.0.1", c.field, c.ref, err, c.field)
		}
		t.Logf("tenant's %s refused: %v", c.field, err)
	}
	if left := storeEntries(t, s); len(left) != 0 {
		t.Fatalf("refused pulls left %q in the store", left)
	}

	// Named by the administrator: pulled, by address and by name.
	s.cfg.PrivateRegistries = []string{reg.Host}
	got, err := s.Pull(tenant, ref, nil)
	if err != nil {
		t.Fatalf("tenant's pull of a registry in images.private_registries: %v", err)
	}
	s.cfg.PrivateRegistries = nil
	s.cfg.Registries = append(s.cfg.Registries, config.Registry{Host: testenv.RegistryName})
	if name, err := s.Resolve(tenant, "FROM", named, nil); err != nil || name != got.Name {
		t.Fatalf("tenant's FROM of a registry in images.registries: %q, %v; want %s", name, err, got.Name)
	}

	// An admin key, and no principal at all, pull as ever.
	s.cfg.Registries = s.cfg.Registries[:1]
	for what, c := range map[string]context.Context{
		"admin key": principal.With(ctx, principal.Principal{KeyName: "root", Tenant: "admin", Admin: true}), "engine": ctx,
	} {
		if _, err := s.Pull(c, ref, nil); err != nil {
			t.Errorf("%s's pull: %v", what, err)
		}
	}
}

// TestPruneRemovesDebris: what an interrupted pull or build left (a lock
// file no process holds, a half-built tree, spool files, a half-written
// reference) goes at `images prune`, however young.
func TestPruneRemovesDebris(t *testing.T) {
	s := newService(t)
	dir := s.images.Dir()
	debris := []string{".lock-oci-0123456789ab", ".build-oci-0123456789ab.1/rootfs/etc/x", "layers/.partial-1", "layers/.partial-blob-2", "layers/.upload-3", "refs/00ff.new"}
	for _, d := range debris {
		p := filepath.Join(dir, d)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// In flight, spools stay: they may be that operation's.
	done := s.useLayers()
	if _, err := s.Prune(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "layers/.upload-3")); err != nil {
		t.Fatalf("a spool file removed while an import was in flight: %v", err)
	}
	done()
	if _, err := s.Prune(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := storeEntries(t, s); len(left) != 0 {
		t.Fatalf("prune left %q", left)
	}
}

// storeEntries lists what the image store holds beyond its empty
// directories.
func storeEntries(t *testing.T, s *Service) []string {
	t.Helper()
	var out []string
	dir := s.images.Dir()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch rel {
		case ".", "by-name", "failed", "layers", "refs", "buildcache":
		default:
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
