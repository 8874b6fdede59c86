package runtime

import (
	"path"
	"slices"
	"strings"

	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
)

// LandlockPaths is what the sandbox of s is meant to reach, for its agent's
// Landlock domain (pkg/landlock): its root and every mount point of the
// spec BuildSpec makes of s, device nodes, masked and read-only paths
// included, each with
// the rights its mount options leave (ro, noexec, nodev). It is read from
// the spec itself, so the domain follows every mount the spec declares and
// nothing else: a mount that reaches the sandbox by another way (a runtime
// or propagation mistake; the test hook of testhook_mounts.go) has no
// rule, and the agent refuses it.
func LandlockPaths(s *Spec) []landlock.Path {
	spec := buildSpec(s)
	paths := []landlock.Path{{Path: "/", Writable: !spec.Root.Readonly, Exec: true}}
	for _, m := range spec.Mounts {
		p := landlock.Path{
			Path:     path.Clean(m.Destination),
			Writable: !slices.Contains(m.Options, "ro"),
			Exec:     !slices.Contains(m.Options, "noexec"),
		}
		// ioctl on device files only in the sandbox's /dev (terminals),
		// where the mount lets devices work at all.
		p.Dev = (p.Path == "/dev" || strings.HasPrefix(p.Path, "/dev/")) && !slices.Contains(m.Options, "nodev")
		// runc turns a cgroup v1 mount into a tmpfs with a mount per
		// controller beneath it.
		p.Tree = m.Type == "cgroup"
		paths = append(paths, p)
	}
	// The device nodes runc creates, or binds from the host when it may
	// not create them (a user namespace): libcontainer's default set and
	// the spec's own.
	for _, d := range specconv.AllowedDevices {
		if d.Path != "" {
			paths = append(paths, landlock.Path{Path: d.Path, Writable: true, Dev: true})
		}
	}
	for _, d := range spec.Linux.Devices {
		paths = append(paths, landlock.Path{Path: path.Clean(d.Path), Writable: true, Dev: true})
	}
	// Masked paths are /dev/null or an empty read-only tmpfs over the
	// real file; read-only paths are read-only binds of themselves.
	for _, p := range slices.Concat(spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths) {
		paths = append(paths, landlock.Path{Path: path.Clean(p)})
	}
	return paths
}

// specMountsFor is where a testing build adds mounts the declared list
// does not have (testhook_mounts.go); nil otherwise.
var specMountsFor func(*Spec) []specs.Mount
