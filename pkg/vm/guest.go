package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// Guest is a bootable Linux guest made from an image of the image store:
// the image's kernel, an initramfs with its virtio modules and the agent,
// and a qcow2 root disk holding the image's tree. Its files are read-only once made; VMs
// write to their own overlays.
type Guest struct {
	Dir     string `json:"-"`
	Image   string `json:"image"`
	Digest  string `json:"digest"` // of the image the guest was made from
	Release string `json:"kernel_release"`
	// Kernel and Initrd are booted directly; both empty means the disk
	// boots through the firmware.
	Kernel string `json:"-"`
	Initrd string `json:"-"`
	Disk   string `json:"-"`
	// DiskBytes is the virtual size of the root disk.
	DiskBytes int64     `json:"disk_bytes"`
	MadeAt    time.Time `json:"made_at"`
	Seconds   float64   `json:"seconds"`
}

// DiskGuest is a guest that boots from its disk through its own boot
// loader: an administrator-prepared image (vm.images.<os>), e.g. Windows.
func DiskGuest(os, disk string) *Guest {
	return &Guest{Image: os, Disk: disk}
}

// guestFormat versions how a guest is made from an image: bump it when
// the initramfs or the disk layout changes, so that cached guests are
// remade.
const guestFormat = "3"

// guestFreeBytes is the free space of a guest's root disk beyond its
// tree: what /workspace and packages installed in the guest can use.
const guestFreeBytes = 1 << 30

// PrepareGuest returns the guest for img with the sandbox-agent binary at
// agentPath, making it under cacheDir unless it exists. The disk and the
// kernel are content-addressed by the image digest and the guest format;
// the initramfs, which carries the agent, also by the agent binary
// and its /init script (initrd-<sha256 prefix>.img beside them), so that a new agent build
// costs a 4 MB initramfs, not a new root disk.
func PrepareGuest(ctx context.Context, img *image.Image, agentPath, cacheDir string) (*Guest, error) {
	ab, err := os.ReadFile(agentPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox-agent: %w", err)
	}
	// The initramfs is named after what it holds beyond the guest's own
	// files: the agent and the /init script (a changed script makes a new
	// initramfs, not a new root disk).
	h := sha256.New()
	h.Write(ab)
	h.Write([]byte(initScript))
	initrdName := "initrd-" + hex.EncodeToString(h.Sum(nil)[:8]) + ".img"
	sum := sha256.Sum256([]byte(img.Digest + "\x00" + guestFormat))
	key := hex.EncodeToString(sum[:16])
	dir := filepath.Join(cacheDir, key)
	g, err := loadGuest(dir)
	if err != nil {
		if g, err = makeGuestDir(ctx, img, cacheDir, key); err != nil {
			return nil, err
		}
	}
	g.Initrd = filepath.Join(dir, initrdName)
	if _, err := os.Stat(g.Initrd); err == nil {
		return g, nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", g.Initrd, os.Getpid())
	defer os.Remove(tmp)
	if err := writeInitramfs(tmp, img.Rootfs, g.Release, agentPath); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Rename(tmp, g.Initrd); err != nil {
		return nil, err
	}
	return g, nil
}

// makeGuestDir makes the kernel and disk of a guest in cacheDir/key.
func makeGuestDir(ctx context.Context, img *image.Image, cacheDir, key string) (*Guest, error) {
	dir := filepath.Join(cacheDir, key)
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".make-"+key+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	g, err := makeGuest(ctx, img, tmp)
	if err != nil {
		return nil, fmt.Errorf("make guest from image %s: %w", img.Name, err)
	}
	g.Seconds = time.Since(start).Seconds()
	b, _ := json.MarshalIndent(g, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "guest.json"), b, 0o444); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Made concurrently by someone else: use theirs.
		if g, lerr := loadGuest(dir); lerr == nil {
			return g, nil
		}
		return nil, err
	}
	return loadGuest(dir)
}

func loadGuest(dir string) (*Guest, error) {
	b, err := os.ReadFile(filepath.Join(dir, "guest.json"))
	if err != nil {
		return nil, err
	}
	var g Guest
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, err
	}
	g.Dir = dir
	g.Kernel = filepath.Join(dir, "vmlinuz")
	g.Disk = filepath.Join(dir, "disk.qcow2")
	for _, f := range []string{g.Kernel, g.Disk} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	return &g, nil
}

// makeGuest builds the kernel and the disk of a guest in dir.
func makeGuest(ctx context.Context, img *image.Image, dir string) (*Guest, error) {
	tree := img.Rootfs
	kernels, _ := filepath.Glob(filepath.Join(tree, "boot/vmlinuz-*"))
	if len(kernels) != 1 {
		return nil, errdefs.Invalidf("image %s: want exactly one /boot/vmlinuz-* (package linux-image-cloud-amd64), found %d", img.Name, len(kernels))
	}
	release := strings.TrimPrefix(filepath.Base(kernels[0]), "vmlinuz-")
	if _, err := os.Stat(filepath.Join(tree, "sbin/sandbox-init")); err != nil {
		return nil, errdefs.Invalidf("image %s: no /sbin/sandbox-init; it is not a VM guest image", img.Name)
	}
	g := &Guest{Image: img.Name, Digest: img.Digest, Release: release, MadeAt: time.Now().UTC()}
	kb, err := os.ReadFile(kernels[0])
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), kb, 0o444); err != nil {
		return nil, err
	}
	used := img.SizeBytes // measured by the image builder
	if used <= 0 {
		return nil, errdefs.Invalidf("image %s: size unknown", img.Name)
	}
	// ext4 metadata (inodes, journal) takes about a tenth on top.
	size := (used + used/10 + guestFreeBytes + (1<<20 - 1)) &^ (1<<20 - 1)
	raw := filepath.Join(dir, "disk.raw")
	f, err := os.Create(raw)
	if err != nil {
		return nil, err
	}
	f.Close()
	// mkfs.ext4 -d copies the tree (owners, modes, xattrs) into the new
	// file system: no loop device, no mount.
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-L", "sandbox-root", "-d", tree,
		"-E", "root_owner=0:0", raw, fmt.Sprintf("%dk", size>>10)); err != nil {
		return nil, err
	}
	if err := run(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, filepath.Join(dir, "disk.qcow2")); err != nil {
		return nil, err
	}
	if err := os.Remove(raw); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(dir, "disk.qcow2"), 0o444); err != nil {
		return nil, err
	}
	g.DiskBytes = size
	return g, nil
}

// run runs a tool and returns its output in the error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	_, err := runTool(ctx, "", name, args...)
	return err
}

// runTool runs a tool with stdin (if not empty) and returns its standard
// output; when it fails, the error holds its output (the end of it).
func runTool(ctx context.Context, stdin, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = lifetime.DieWithParent()
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, both bytes.Buffer
	cmd.Stdout = io.MultiWriter(&stdout, &both)
	cmd.Stderr = &both
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(both.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		if errors.Is(err, exec.ErrNotFound) {
			return "", errdefs.Wrap(errdefs.Unavailable, err, "%s not installed (scripts/install-deps.sh)", name)
		}
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}
