// Package userns gives sandboxes their own user namespace: the id mapping
// of one sandbox (a range of unprivileged host ids), a user namespace file
// descriptor with that mapping for the kernel's idmapped mounts, and the
// idmapped clone of a directory tree (how the shared, read-only image is
// presented to a sandbox with its own ids, without copying or chowning it).
//
// Security boundary: with a mapping, uid 0 inside a sandbox is host uid
// HostID, an id no host account and no other sandbox has (pkg/store hands
// out each range once). Capabilities the sandbox's processes hold are
// capabilities in that namespace only: they never apply to host files whose
// owner is outside the range (everything outside the sandbox's own disk and
// its idmapped image), nor to other sandboxes' processes or per-uid kernel
// limits, which are counted per host uid.
package userns

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// IDMap maps ids 0..Size-1 inside a sandbox to HostID..HostID+Size-1 on the
// host, for users and groups alike.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// Host returns the host id of id inside the namespace (id must be < Size).
func (m IDMap) Host(id int) int { return int(m.HostID) + id }

// String is the mapping in uid_map's syntax.
func (m IDMap) String() string { return fmt.Sprintf("0 %d %d", m.HostID, m.Size) }

// Pin bind-mounts the namespace nsfd at path (a new file), so that it
// outlives every descriptor and process: the runtime joins it by path.
// Unmounting path (image.ReleaseDir of the sandbox's dir) lets it go.
func Pin(nsfd *os.File, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		return fmt.Errorf("pin user namespace: %w", err)
	}
	f.Close()
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(int(nsfd.Fd())), path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("pin user namespace at %s: %w", path, err)
	}
	return nil
}

// MountIdmapped attaches at target (an existing directory) a recursive,
// read-only clone of the tree at source whose ids are shifted by nsfd's
// mapping: a file owned by uid 0 on disk appears owned by HostID. Nothing
// is copied; source is untouched. The clone is nosuid and nodev.
func MountIdmapped(source, target string, nsfd *os.File) error {
	return mountIdmapped(source, target, nsfd, true)
}

// MountIdmappedWritable is MountIdmapped for a tree the sandbox writes (a
// named volume): read-write unless readOnly. What the sandbox's uid n
// writes is stored on disk as uid n, so every sandbox that mounts the same
// tree through its own namespace sees the same owners.
func MountIdmappedWritable(source, target string, nsfd *os.File, readOnly bool) error {
	return mountIdmapped(source, target, nsfd, readOnly)
}

func mountIdmapped(source, target string, nsfd *os.File, readOnly bool) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", source, err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(nsfd.Fd()),
	}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("idmap %s (mount_setattr): %w", source, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach idmapped %s at %s: %w", source, target, err)
	}
	return nil
}

// MinKernel is the oldest kernel whose overlayfs accepts idmapped lower
// layers (Linux 5.19; idmapped mounts themselves came in 5.12).
var MinKernel = [2]int{5, 19}

var (
	kernelOnce sync.Once
	kernelErr  error
)

// Supported reports whether this kernel can run sandboxes in their own user
// namespace with the image shared through idmapped overlay layers: nil, or
// an error saying what is missing.
func Supported() error {
	kernelOnce.Do(func() {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			kernelErr = fmt.Errorf("uname: %w", err)
			return
		}
		rel := unix.ByteSliceToString(u.Release[:])
		major, minor, ok := parseRelease(rel)
		if !ok {
			kernelErr = fmt.Errorf("cannot read the kernel version from %q", rel)
			return
		}
		if major < MinKernel[0] || major == MinKernel[0] && minor < MinKernel[1] {
			kernelErr = fmt.Errorf("kernel %s is older than %d.%d: overlayfs cannot use idmapped lower layers", rel, MinKernel[0], MinKernel[1])
			return
		}
		if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
			kernelErr = errors.New("user namespaces are disabled (user.max_user_namespaces is 0)")
		}
	})
	return kernelErr
}

func parseRelease(rel string) (major, minor int, ok bool) {
	a, rest, ok1 := strings.Cut(rel, ".")
	b, _, _ := strings.Cut(rest, ".")
	if i := strings.IndexFunc(b, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		b = b[:i]
	}
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	return x, y, ok1 && err1 == nil && err2 == nil
}
