package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// InNetNS runs fn on an OS thread that has joined ns. The thread is never
// handed back to the Go scheduler (the goroutine ends with the thread still
// locked, so the runtime discards it): no other goroutine can ever run in a
// namespace it did not ask for, even if switching back would fail.
// Sockets fn creates stay in ns for their whole life.
func InNetNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("join network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// CreateNetNS makes a new network namespace kept alive by a bind mount on
// path (an empty file), like `ip netns add` but at a path of our choosing:
// the runtime joins it by path, and the namespace outlives every process
// in it until RemoveNetNS. sysctls (dotted names, net.* only) are written
// into it by the thread that made it, before it is mounted, so nothing can
// join it without them. An existing mount at path is kept (adoption after
// a restart); sysctls are written into it again, a no-op for a namespace
// made here (it kept them) that covers one made by an older daemon.
func CreateNetNS(path string, sysctls map[string]string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if isNetNSMount(path) {
		if len(sysctls) == 0 {
			return nil
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			return err
		}
		defer ns.Close()
		return InNetNS(ns, func() error { return writeSysctlsHere(sysctls) })
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread unshares its network namespace and is never unlocked,
		// so it dies with the goroutine instead of running other code in
		// the new namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		// Only after a successful unshare: this thread is in the new
		// namespace, not the daemon's.
		if err := writeSysctlsHere(sysctls); err != nil {
			errc <- err
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount network namespace on %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// isNetNSMount reports whether path is a bind mount of a network namespace.
func isNetNSMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// RemoveNetNS unmounts and removes a namespace made by CreateNetNS; the
// namespace itself goes when its last process does. Idempotent.
func RemoveNetNS(path string) error {
	for isNetNSMount(path) {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// writeSysctl writes a /proc/sys file as seen from ns (net.* sysctls are
// per network namespace) and returns the previous value.
func writeSysctl(ns netns.NsHandle, name, value string) (old string, err error) {
	err = InNetNS(ns, func() (err error) {
		old, err = writeSysctlHere(name, value)
		return err
	})
	return old, err
}

// writeSysctlHere writes a /proc/sys file (name with slashes) as seen
// from the calling thread, which is locked into the namespace meant, and
// returns the previous value.
func writeSysctlHere(name, value string) (old string, err error) {
	path := filepath.Join("/proc/sys", filepath.FromSlash(name))
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	old = string(trimNL(b))
	if old == value {
		return old, nil
	}
	return old, os.WriteFile(path, []byte(value), 0o644)
}

// writeSysctlsHere writes sysctls (dotted names) as writeSysctlHere does.
func writeSysctlsHere(sysctls map[string]string) error {
	for name, value := range sysctls {
		if _, err := writeSysctlHere(strings.ReplaceAll(name, ".", "/"), value); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
		}
	}
	return nil
}

// readSysctl reads a /proc/sys file as seen from ns.
func readSysctl(ns netns.NsHandle, name string) (string, error) {
	var v string
	err := InNetNS(ns, func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", filepath.FromSlash(name)))
		v = string(trimNL(b))
		return err
	})
	return v, err
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// SandboxSysctls are the sysctls of every sandbox's own network namespace,
// in the dotted form of the OCI spec's linux.sysctl. This package writes
// them into the namespaces it makes (Attach, through CreateNetNS); a sandbox
// without network gets a new namespace from libcontainer, and the container
// backend hands them to its init through the runtime spec (runtime.Spec
// NetSysctls), written there by the sandbox's own root, whose user
// namespace owns that network namespace.
//
// net.ipv4.ip_unprivileged_port_start=0, as Docker (20.10 and later) sets
// in every container's namespace: any process of the sandbox, root mode or
// not, may bind ports below 1024, so a dev server on port 80 works without
// privileges. Why this is safe: the value belongs to one network namespace
// (IPv6 binds read the same per-namespace field) and that namespace is the
// sandbox's alone, so it opens only the sandbox's own ports to the
// sandbox's own processes; nothing on the host or in another sandbox can
// be bound through it, and nothing outside can connect in (firewall.go).
// The host's namespace keeps its value: the daemon writes it only on a
// thread that has just unshared a new namespace (never if the unshare
// failed) or joined an adopted one of its own by path, never in the
// namespace it runs in; and the host reaches a sandbox's port only through the preview proxy (a connection
// the sandbox's agent opens inside the namespace), never by a bind.
func SandboxSysctls() map[string]string {
	return map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}
}
