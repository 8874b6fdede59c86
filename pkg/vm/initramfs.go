package vm

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The initramfs of the Linux guest loads the virtio modules Debian builds
// as modules (virtio_pci, virtio_blk, virtio_console and their
// dependencies; ext4 and the TPM TIS driver are built in), mounts the root
// disk, puts the daemon's sandbox-agent on a tmpfs /run in it and switches
// to it. Busybox and the modules come from the guest image itself, so that
// kernel and modules always match; the agent comes from the daemon, so
// that guest and daemon speak the same protocol version.

// bootModules are the modules the guest needs before its root is mounted,
// dependencies excluded (they are resolved from modules.dep).
var bootModules = []string{"virtio_pci", "virtio_blk", "virtio_console"}

// initScript is /init of the initramfs. A failure powers the guest off:
// with -no-reboot QEMU then exits, so a broken image fails fast instead
// of hanging until a timeout.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
fail() { echo "initramfs: $*" > /dev/console; poweroff -f; }
for m in $(cat /modules.order); do insmod "/$m" || fail "insmod $m"; done
# The root file system: the whole first disk (the built guest's root disk,
# direct kernel boot), or root=/dev/... from the kernel command line (a
# boot disk's partition, e.g. root=/dev/vda2; see MakeBootDisk).
root=/dev/vda
for a in $(cat /proc/cmdline); do
	case "$a" in root=/dev/*) root="${a#root=}" ;; esac
done
# virtio_blk creates the disk while insmod runs; a partition may follow
# a little later. Wait up to 60 s of guest time: a disk that is really
# missing is an image error, and the host's boot budget bounds the boot
# anyway, so this only needs to outlast a starved guest.
i=0
while [ ! -b "$root" ]; do
	i=$((i+1)); [ $i -gt 6000 ] && fail "no $root"
	sleep 0.01
done
mount -t ext4 -o rw,noatime "$root" /newroot || fail "mount $root"
# The daemon's sandbox-agent, for this boot only: /run of the new root is a
# tmpfs made here (sandbox-init leaves a mounted /run alone).
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /newroot/run || fail "mount /run"
mkdir -m 700 /newroot/run/sandboxd
cp /sandbox-agent /newroot/run/sandboxd/agent && chmod 755 /newroot/run/sandboxd/agent || fail "copy agent"
umount /proc
umount /dev
exec switch_root /newroot /sbin/sandbox-init
`

// moduleOrder returns the module files (relative to /lib/modules/<release>)
// to load, dependencies first, read from modules.dep.
func moduleOrder(modDir string, want []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{} // file -> dependency files
	byName := map[string]string{} // module name -> file
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		file, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[file] = strings.Fields(rest)
		base := filepath.Base(file)
		name := strings.ReplaceAll(base[:strings.Index(base, ".ko")], "-", "_")
		byName[name] = file
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var order []string
	var visit func(file string, depth int) error
	visit = func(file string, depth int) error {
		if slices.Contains(order, file) {
			return nil
		}
		if depth > 32 {
			return fmt.Errorf("module dependency loop at %s", file)
		}
		for _, d := range deps[file] {
			if err := visit(d, depth+1); err != nil {
				return err
			}
		}
		order = append(order, file)
		return nil
	}
	for _, name := range want {
		file, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("module %s not in %s/modules.dep (built in? then drop it from the list)", name, modDir)
		}
		if err := visit(file, 0); err != nil {
			return nil, err
		}
	}
	for _, m := range order {
		if !strings.HasSuffix(m, ".ko") {
			return nil, fmt.Errorf("module %s is compressed; busybox insmod needs plain .ko", m)
		}
	}
	return order, nil
}

// writeInitramfs writes a gzip'd newc cpio archive with busybox, the boot
// modules of the kernel release in tree, the sandbox-agent binary and /init.
func writeInitramfs(out, tree, release, agentPath string) error {
	modDir := filepath.Join(tree, "lib/modules", release)
	order, err := moduleOrder(modDir, bootModules)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	w := &cpioWriter{w: zw, ino: 1}
	for _, d := range []string{"bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"} {
		w.dir(d)
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs is
	// mounted; without the node init runs without output.
	w.charDev("dev/console", 5, 1)
	bb, err := os.ReadFile(filepath.Join(tree, "usr/bin/busybox"))
	if err != nil {
		return fmt.Errorf("busybox (package busybox-static) in the guest image: %w", err)
	}
	w.file("bin/busybox", 0o755, bb)
	w.file("init", 0o755, []byte(initScript))
	ab, err := os.ReadFile(agentPath)
	if err != nil {
		return fmt.Errorf("sandbox-agent: %w", err)
	}
	w.file("sandbox-agent", 0o755, ab)
	dirs := map[string]bool{}
	var list []string
	for _, m := range order {
		dst := filepath.Join("lib/modules", release, m)
		for d := filepath.Dir(dst); d != "lib/modules" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return err
		}
		list = append(list, dst)
		w.pending = append(w.pending, pendingFile{dst, b})
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	slices.SortFunc(sorted, func(a, b string) int { return strings.Count(a, "/") - strings.Count(b, "/") })
	for _, d := range sorted {
		w.dir(d)
	}
	for _, p := range w.pending {
		w.file(p.name, 0o644, p.data)
	}
	w.file("modules.order", 0o644, []byte(strings.Join(list, "\n")+"\n"))
	w.trailer()
	if w.err != nil {
		return w.err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

type pendingFile struct {
	name string
	data []byte
}

// cpioWriter writes the "newc" cpio format the kernel unpacks.
type cpioWriter struct {
	w       io.Writer
	ino     int
	n       int64
	err     error
	pending []pendingFile
}

func (c *cpioWriter) header(name string, mode uint32, size int, major, minor int) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, major, minor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) dir(name string) { c.header(name, 0o040755, 0, 0, 0) }

func (c *cpioWriter) charDev(name string, major, minor int) {
	c.header(name, 0o020600, 0, major, minor)
}

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.header(name, 0o100000|perm, len(data), 0, 0)
	c.write(data)
	c.pad()
}

func (c *cpioWriter) trailer() { c.header("TRAILER!!!", 0, 0, 0, 0) }
