// Package vmenv extends internal/testenv for VM tests: the Linux test
// guest, built once into testenv's shared image cache. It is separate from
// testenv because it imports pkg/vm, which imports pkg/cgroups, whose own
// tests import testenv.
package vmenv

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

var vmGuest struct {
	once  sync.Once
	image *image.Image
	guest *vm.Guest
	err   error
}

// buildSlot serialises guest builds within a test binary (an mmdebstrap
// run, on two cores).
var buildSlot sync.Mutex

// Guest returns the Linux test guest of the VM backend: the image of
// rootfs/vm/vm-linux.yaml, built into the shared image cache, made into a
// bootable guest with the test agent (testenv.AgentPath) under GuestCache. Both steps are
// content-addressed, so an unchanged recipe costs nothing after the first
// run (the build takes a minute or two, the guest a few seconds).
func Guest(t testing.TB) *vm.Guest {
	t.Helper()
	vmGuest.once.Do(func() {
		buildSlot.Lock()
		defer buildSlot.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		st, err := image.OpenStore(testenv.ImagesDir())
		if err != nil {
			vmGuest.err = err
			return
		}
		r, err := image.LoadRecipe(filepath.Join(testenv.RepoRoot, "rootfs", "vm", "vm-linux.yaml"))
		if err != nil {
			vmGuest.err = err
			return
		}
		b := &image.Builder{Store: st, Suite: config.Default().Images.Suite, Log: io.Discard}
		img, err := b.Ensure(ctx, r)
		if err != nil {
			vmGuest.err = err
			return
		}
		vmGuest.image = img
		vmGuest.guest, vmGuest.err = vm.PrepareGuest(ctx, img, testenv.AgentPath(t), GuestCache())
	})
	if vmGuest.err != nil {
		t.Fatalf("vm guest: %v", vmGuest.err)
	}
	return vmGuest.guest
}

// Image returns the image of the Linux test guest (see Guest), what the
// VM sandbox backend starts sandboxes from.
func Image(t testing.TB) *image.Image {
	t.Helper()
	Guest(t)
	return vmGuest.image
}

// GuestCache is where guests and fast-start templates are cached, beside
// the image cache.
func GuestCache() string { return filepath.Join(testenv.ImagesDir(), "vm-guests") }
