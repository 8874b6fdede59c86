package oci_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
)

// hostsResolver answers its names from a map, as a hosts file would,
// counting lookups; any other name is not found.
type hostsResolver struct {
	hosts   map[string]string
	lookups atomic.Int64
}

func (r *hostsResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if a, ok := r.hosts[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// smallImage is a one-layer image, quick to push and pull.
func smallImage(t *testing.T, marker string) v1.Image {
	return testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "etc/marker", Body: marker}), Comp: "gzip"}}, testenv.OCIImageOpts{})
}

// refused checks that err is the egress refusal: permission_denied naming
// field and every one of want.
func refused(t *testing.T, what string, err error, field string, want ...string) {
	t.Helper()
	if errdefs.CodeOf(err) != errdefs.PermissionDenied || !strings.HasPrefix(errdefs.MessageOf(err), field+": ") {
		t.Fatalf("%s: %v (%s), want permission_denied naming %s", what, err, errdefs.CodeOf(err), field)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
	t.Logf("%s refused: %v", what, err)
}

// TestEgressRestrictedPull: a restricted pull (a non-admin key's) of a
// registry on loopback — named by address, by a DNS name pointing at it,
// or redirected to by another server — is refused before anything reaches
// the store, and goes through once the allow list names the registry.
func TestEgressRestrictedPull(t *testing.T) {
	reg := testenv.NewRegistry(t, false)
	ref := reg.Push(t, reg.Ref("egress/small:1"), smallImage(t, "by address"))
	_, port, _ := net.SplitHostPort(reg.Host)

	t.Run("loopback-address", func(t *testing.T) {
		im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{}})
		_, err := im.Pull(ctx(t), "image", ref.String(), nil)
		refused(t, "pull of "+ref.String(), err, "image", "registry "+reg.Host, "127.0.0.1", "loopback", "images.private_registries")
		assertEmptyStore(t, st)

		// Another registry named does not let this one through.
		im, _ = newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Allowed: []string{"127.0.0.1:1", "registry.example"}}})
		_, err = im.Pull(ctx(t), "reference", ref.String(), nil)
		refused(t, "pull with other registries allowed", err, "reference", "127.0.0.1")

		for _, allowed := range []string{reg.Host, "127.0.0.1"} {
			im, _ = newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Allowed: []string{allowed}}})
			if _, err := im.Pull(ctx(t), "reference", ref.String(), nil); err != nil {
				t.Fatalf("pull with %s allowed: %v", allowed, err)
			}
		}
	})

	t.Run("dns-name", func(t *testing.T) {
		named := testenv.RegistryName + ":" + port + "/egress/small:1"
		res := &hostsResolver{hosts: map[string]string{testenv.RegistryName: "127.0.0.1"}}
		im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Resolver: res}})
		_, err := im.Pull(ctx(t), "reference", named, nil)
		refused(t, "pull of "+named, err, "reference", testenv.RegistryName, "127.0.0.1", "loopback")
		assertEmptyStore(t, st)
		if res.lookups.Load() == 0 {
			t.Fatal("the name was never looked up: the refusal was not of the address it resolves to")
		}
		// The name is what the allow list names; the address it resolves
		// to is dialled, once looked up.
		im, st = newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Resolver: res, Allowed: []string{testenv.RegistryName}}})
		got, err := im.Pull(ctx(t), "reference", named, nil)
		if err != nil {
			t.Fatalf("pull of %s with its name allowed: %v", named, err)
		}
		if name, err := im.Lookup(named); err != nil || name != got.Name {
			t.Errorf("reference %s recorded as %q (%v), want %s", named, name, err, got.Name)
		}
		_ = st
	})

	t.Run("redirect", func(t *testing.T) {
		// A front that sends every request on to the registry, as a
		// registry sends blobs to their storage.
		var redirected atomic.Int64
		front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			redirected.Add(1)
			http.Redirect(w, r, "https://"+reg.Host+r.URL.RequestURI(), http.StatusTemporaryRedirect)
		}))
		// The registry's certificate (of 127.0.0.1): TLS as registries are
		// reached.
		cert, err := tls.LoadX509KeyPair(filepath.Join(reg.Dir, "cert.pem"), filepath.Join(reg.Dir, "key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		front.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		front.StartTLS()
		t.Cleanup(front.Close)
		frontHost := strings.TrimPrefix(front.URL, "https://")
		via := frontHost + "/egress/small:1"

		im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Allowed: []string{frontHost}}})
		_, err = im.Pull(ctx(t), "reference", via, nil)
		refused(t, "pull redirected to "+reg.Host, err, "reference", "registry "+frontHost+" sent the pull to "+reg.Host, "127.0.0.1", "loopback")
		assertEmptyStore(t, st)
		if redirected.Load() == 0 {
			t.Fatal("the front was never asked: the refusal was not of the redirect")
		}

		im, _ = newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}, Egress: &oci.Egress{Allowed: []string{frontHost, reg.Host}}})
		if _, err := im.Pull(ctx(t), "reference", via, nil); err != nil {
			t.Fatalf("pull through the redirect with both allowed: %v", err)
		}
	})

	t.Run("unrestricted", func(t *testing.T) {
		// No Egress (an administrator's pull): as before.
		im, _ := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}})
		if _, err := im.Pull(ctx(t), "reference", ref.String(), nil); err != nil {
			t.Fatalf("unrestricted pull: %v", err)
		}
	})
}

// TestInterruptedPullLeavesNothing: a pull cancelled while its layers are
// being unpacked leaves no tree, layer, spool file, reference or lock.
func TestInterruptedPullLeavesNothing(t *testing.T) {
	reg := testenv.NewRegistry(t, false)
	layers := make([]testenv.OCILayer, 3)
	for i := range layers {
		layers[i] = testenv.OCILayer{Tar: testenv.TarOf(t, testenv.TarEntry{Name: fmt.Sprintf("l%d/data", i), Size: 4 << 20}), Comp: "gzip"}
	}
	ref := reg.Push(t, reg.Ref("interrupt/three:1"), testenv.MakeOCIImage(t, v1.Config{}, layers, testenv.OCIImageOpts{}))
	im, st := newImporter(t, oci.Options{CAFiles: []string{reg.CAFile}})
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	_, err := im.Pull(c, "reference", ref.String(), func(p apitypes.ImageProgress) {
		if p.Phase == "layer" && p.Index == 0 {
			cancel() // the first layer is in; the others are not
		}
	})
	if err == nil {
		t.Fatal("cancelled pull succeeded")
	}
	t.Logf("cancelled pull: %v", err)
	assertEmptyStore(t, st)
}
