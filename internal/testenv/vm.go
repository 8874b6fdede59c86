package testenv

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

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

// VMGuest returns the Linux test guest of the VM backend: the image of
// rootfs/vm/vm-linux.yaml, built into the shared image cache, made into a
// bootable guest with the test agent (AgentPath) under ImagesDir()/vm-guests. Both steps are
// content-addressed, so an unchanged recipe costs nothing after the first
// run (the build takes a minute or two, the guest a few seconds).
func VMGuest(t testing.TB) *vm.Guest {
	t.Helper()
	vmGuest.once.Do(func() {
		buildSlots <- struct{}{}
		defer func() { <-buildSlots }()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		st, err := image.OpenStore(ImagesDir())
		if err != nil {
			vmGuest.err = err
			return
		}
		r, err := image.LoadRecipe(filepath.Join(RepoRoot, "rootfs", "vm", "vm-linux.yaml"))
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
		vmGuest.guest, vmGuest.err = vm.PrepareGuest(ctx, img, AgentPath(t), filepath.Join(ImagesDir(), "vm-guests"))
	})
	if vmGuest.err != nil {
		t.Fatalf("vm guest: %v", vmGuest.err)
	}
	return vmGuest.guest
}

// VMImage returns the image of the Linux test guest (see VMGuest), what
// the VM sandbox backend starts sandboxes from.
func VMImage(t testing.TB) *image.Image {
	t.Helper()
	VMGuest(t)
	return vmGuest.image
}
