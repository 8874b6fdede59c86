package userns_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/userns"
)

// nsGetOwnerUID is NS_GET_OWNER_UID, _IO(0xb7, 0x4) (linux/nsfs.h).
const nsGetOwnerUID = 0xb704

// TestNamespaceAndIdmappedClone: the namespace is owned by the range's
// first host id (not root: per-user kernel counts land there) and maps the
// range; an idmapped clone shows a root-owned file as that host id,
// read-only, while the source keeps its owner.
func TestNamespaceAndIdmappedClone(t *testing.T) {
	testenv.RequireRoot(t)
	if err := userns.Supported(); err != nil {
		testenv.SkipOrFail(t, "kernel: %v", err)
	}
	m := userns.IDMap{HostID: 0x7f000000, Size: 65536}
	ns, err := userns.NamespaceFD(m)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var owner uint32
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); errno != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", errno)
	}
	if owner != m.HostID {
		t.Errorf("namespace owned by %d, want %d", owner, m.HostID)
	}

	src, dst := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "f"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := userns.MountIdmapped(src, dst, ns); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dst, unix.MNT_DETACH)
	fi, err := os.Stat(filepath.Join(dst, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != m.HostID || st.Gid != m.HostID {
		t.Errorf("idmapped file owned by %d:%d, want %d", st.Uid, st.Gid, m.HostID)
	}
	if err := os.WriteFile(filepath.Join(dst, "g"), nil, 0o644); err == nil {
		t.Errorf("the idmapped clone is writable")
	}
	fi, _ = os.Stat(filepath.Join(src, "f"))
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Errorf("the source changed owner: %d", st.Uid)
	}
}
