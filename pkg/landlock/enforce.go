package landlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"github.com/moby/sys/mountinfo"
)

// Access rights, as the kernel names them (Documentation/userspace-api/
// landlock.rst). Every filesystem right go-landlock knows is handled, so a
// right this code does not grant is refused on kernels that have it;
// BestEffort drops those the kernel lacks.
const (
	handled  = landlock.AccessFSSet(1<<17 - 1) // execute … resolve_unix (ABI 9)
	readFS   = landlock.AccessFSSet(llsys.AccessFSReadFile | llsys.AccessFSReadDir | llsys.AccessFSResolveUnix)
	execFS   = landlock.AccessFSSet(llsys.AccessFSExecute)
	ioctlDev = landlock.AccessFSSet(llsys.AccessFSIoctlDev)
	writeFS  = landlock.AccessFSSet(llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
		llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock |
		llsys.AccessFSMakeFifo | llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSRefer |
		llsys.AccessFSTruncate)
	// fileFS are the rights the kernel takes on a rule for a file that is
	// not a directory.
	fileFS = landlock.AccessFSSet(llsys.AccessFSExecute | llsys.AccessFSWriteFile | llsys.AccessFSReadFile |
		llsys.AccessFSTruncate | llsys.AccessFSIoctlDev)
)

// access is what p grants beneath it.
func (p Path) access() landlock.AccessFSSet {
	a := readFS
	if p.Writable {
		a |= writeFS
	}
	if p.Exec {
		a |= execFS
	}
	if p.Dev {
		a |= ioctlDev
	}
	return a
}

// Report is what Enforce did.
type Report struct {
	ABI int // the kernel's ABI the domain was made under
	// Undeclared are the mount points found that no declared path names:
	// nothing in the sandbox can open anything beneath them.
	Undeclared []string
	Rules      int // path rules in the ruleset
}

// Enforce confines the calling process, all its threads and every process
// it starts from now on to paths: nothing else of the file system can be
// opened, executed, listed, created or removed. It must run before the
// process starts any child. The domain cannot be left or widened.
func Enforce(paths []Path) (Report, error) {
	rep := Report{ABI: ABI()}
	if rep.ABI < MinABI {
		return rep, fmt.Errorf("landlock: the kernel's ABI is %d, %d or later is needed", rep.ABI, MinABI)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return rep, fmt.Errorf("landlock: read the mount table: %w", err)
	}
	paths = withResolved(paths)
	rep.Undeclared = undeclared(paths, mounts)
	rules, err := plan(paths, rep.Undeclared, mounts)
	if err != nil {
		return rep, err
	}
	rep.Rules = len(rules)
	ll := make([]landlock.Rule, len(rules))
	for i, r := range rules {
		ll[i] = landlock.PathAccess(r.access, r.path)
	}
	// Best effort downgrades the handled rights to the kernel's ABI (no
	// truncate right before 3, no ioctl right before 5, ...): on an older
	// kernel those operations stay unrestricted rather than refused.
	if err := (landlock.Config{HandledAccessFS: handled}).BestEffort().RestrictPaths(ll...); err != nil {
		return rep, fmt.Errorf("landlock: %w", err)
	}
	return rep, nil
}

// withResolved adds, for each declared path that leads through a symlink
// of the image, the path its mount really sits at (the runtime follows
// such symlinks inside the rootfs when it mounts; the mount table names
// the target). The agent resolves them before any command runs, so no
// command can have planted one since.
func withResolved(paths []Path) []Path {
	out := slices.Clone(paths)
	for _, p := range paths {
		if r, err := filepath.EvalSymlinks(p.Path); err == nil && r != p.Path {
			q := p
			q.Path = r
			out = append(out, q)
		}
	}
	return out
}

// undeclared lists the mount points of mounts that no declared path
// names and that are not beneath a declared tree, sorted.
func undeclared(paths []Path, mounts []*mountinfo.Info) []string {
	declared := make(map[string]bool, len(paths))
	var trees []string
	for _, p := range paths {
		declared[p.Path] = true
		if p.Tree {
			trees = append(trees, p.Path)
		}
	}
	beneathTree := func(mp string) bool {
		return slices.ContainsFunc(trees, func(t string) bool { return len(holesBeneath(t, []string{mp})) > 0 })
	}
	var out []string
	for _, m := range mounts {
		if !declared[m.Mountpoint] && !beneathTree(m.Mountpoint) && !slices.Contains(out, m.Mountpoint) {
			out = append(out, m.Mountpoint)
		}
	}
	slices.Sort(out)
	return out
}

// rule is one path-beneath rule.
type rule struct {
	path   string
	access landlock.AccessFSSet
}

// plan turns the declared paths into rules that grant nothing beneath an
// undeclared mount point (a hole). Landlock has no deny rule, and a rule
// on a directory covers everything beneath it, across mount points: a
// declared path with a hole beneath it cannot have its own rule. It is
// split instead, level by level down to the hole: each entry beside the
// way down gets the declared path's rule, the hole none. The directories
// on the way down get no rule of their own: they can be walked through
// but not listed, written to or removed (a price paid only when a mount
// was not declared). Entries are read once, now; entries made later in a
// split directory are not reachable, which is why a hole under procfs,
// whose entries come and go with processes, is refused outright.
func plan(paths []Path, holes []string, mounts []*mountinfo.Info) ([]rule, error) {
	fstype := make(map[string]string, len(mounts))
	for _, m := range mounts {
		fstype[m.Mountpoint] = m.FSType // the last, topmost, mount wins
	}
	var rules []rule
	for _, p := range paths {
		fi, err := os.Stat(p.Path)
		if errors.Is(err, os.ErrNotExist) {
			continue // a masked path this kernel does not have
		}
		if err != nil {
			return nil, fmt.Errorf("landlock: %w", err)
		}
		if !fi.IsDir() {
			rules = append(rules, rule{p.Path, p.access() & fileFS})
			continue
		}
		if !holeBeneath(p.Path, holes) {
			rules = append(rules, rule{p.Path, p.access()})
			continue
		}
		if t := fstype[p.Path]; t == "proc" {
			return nil, fmt.Errorf("landlock: undeclared mount beneath %s (%s): refusing to start", p.Path, strings.Join(holesBeneath(p.Path, holes), ", "))
		}
		split, err := splitAround(p.Path, p.access(), holes)
		if err != nil {
			return nil, err
		}
		rules = append(rules, split...)
	}
	return rules, nil
}

// splitAround is the rules that grant access beneath dir except beneath
// the holes (some of which are beneath dir).
func splitAround(dir string, access landlock.AccessFSSet, holes []string) ([]rule, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("landlock: list %s: %w", dir, err)
	}
	var rules []rule
	for _, e := range entries {
		child := filepath.Join(dir, e.Name())
		switch {
		case slices.Contains(holes, child):
			// The undeclared mount point: no rule.
		case e.Type()&os.ModeSymlink != 0:
			// A rule would be on its target, which may be the hole;
			// the target has its own rule where it is.
		case !e.IsDir():
			rules = append(rules, rule{child, access & fileFS})
		case holeBeneath(child, holes):
			r, err := splitAround(child, access, holes)
			if err != nil {
				return nil, err
			}
			rules = append(rules, r...)
		default:
			rules = append(rules, rule{child, access})
		}
	}
	return rules, nil
}

// holeBeneath reports whether a hole lies strictly beneath dir.
func holeBeneath(dir string, holes []string) bool { return len(holesBeneath(dir, holes)) > 0 }

func holesBeneath(dir string, holes []string) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for _, h := range holes {
		if strings.HasPrefix(h, prefix) {
			out = append(out, h)
		}
	}
	return out
}
