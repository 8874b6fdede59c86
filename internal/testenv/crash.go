package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// WaitExited waits up to d for the daemon to exit on its own (a crash
// point) and reports how it exited.
func (d *Daemon) WaitExited(timeout time.Duration) error {
	select {
	case <-d.exited:
		d.cmd = nil
		return d.exitErr
	case <-time.After(timeout):
		return fmt.Errorf("daemon still running after %s", timeout)
	}
}

// ProcessesInCgroup lists the live host processes whose cgroup path (in any
// hierarchy) lies under parent. Zombies are left out: a sandbox init killed
// after its daemon died was re-parented to the host's init, which reaps it
// when it gets to it; it holds nothing but its pid until then.
func ProcessesInCgroup(parent string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if i := strings.LastIndexByte(line, ':'); i >= 0 && strings.HasPrefix(line[i+1:], parent+"/") {
				out = append(out, filepath.Base(filepath.Dir(p)))
				break
			}
		}
	}
	return out
}
