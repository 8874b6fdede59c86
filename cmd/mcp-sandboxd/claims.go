package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/hostclaim"
)

// claimHostNames claims, for the daemon's life, the host-wide names of its
// configuration other than the network's (pkg/network claims those in its
// namespace): paths.run_dir (libcontainer state, sandbox dirs, network
// namespace files, the API socket) and sandbox.cgroup_parent (the backends'
// scans take every sandbox-named cgroup under it for theirs). Two daemons
// sharing either would remove each other's sandboxes as leftovers, so a
// live holder refuses this start, naming itself and the setting (the state
// directory's lock already refuses a shared state dir).
func claimHostNames(cfg *config.Config) (release func(), err error) {
	var held []*hostclaim.Claim
	release = func() {
		for _, c := range held {
			_ = c.Release()
		}
	}
	if err := os.MkdirAll(cfg.Paths.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("paths.run_dir: %w", err)
	}
	c, err := hostclaim.Path(cfg.Paths.RunDir, "paths.run_dir")
	if err != nil {
		return nil, err
	}
	held = append(held, c)
	if err := cgroups.EnsureParent(cfg.Sandbox.CgroupParent); err != nil {
		release()
		return nil, fmt.Errorf("sandbox.cgroup_parent: %w", err)
	}
	dirs := cgroups.Dirs(cfg.Sandbox.CgroupParent)
	if len(dirs) == 0 {
		release()
		return nil, errors.New("sandbox.cgroup_parent: " + cfg.Sandbox.CgroupParent + " exists in no cgroup hierarchy")
	}
	// One hierarchy's directory stands for the path: every daemon claims
	// the same one (Dirs lists them in a fixed order).
	if c, err = hostclaim.Path(dirs[0], "sandbox.cgroup_parent"); err != nil {
		release()
		var inUse *hostclaim.InUseError
		if errors.As(err, &inUse) {
			inUse.Value = cfg.Sandbox.CgroupParent
		}
		return nil, err
	}
	held = append(held, c)
	return release, nil
}
