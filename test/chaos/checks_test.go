//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// released lists what of sandbox id is still held: a cgroup, a state
// directory, a disk image or its loop device, a ledger entry, a user
// namespace id range, a network lease or a port exposure.
func (r *rig) released(st *store.Store, id string, loops map[string]string) []string {
	cfg := r.d.Config
	var held []string
	for _, p := range []string{cfg.Sandbox.CgroupParent + "/" + id, cfg.Sandbox.CgroupParent + "/vms/" + id} {
		for _, dir := range testenv.CgroupDirs(p) {
			held = append(held, "cgroup "+dir)
		}
	}
	for _, sub := range []string{"runtime", "sandboxes", "vms", "netns"} {
		if _, err := os.Lstat(filepath.Join(cfg.Paths.RunDir, sub, id)); err == nil {
			held = append(held, "run dir "+sub+"/"+id)
		}
	}
	img := filepath.Join(cfg.Paths.SandboxesDirOrDefault(), id+".img")
	if _, err := os.Lstat(img); err == nil {
		held = append(held, "image "+img)
	}
	for dev, backing := range loops {
		if backing == img {
			held = append(held, "loop device "+dev)
		}
	}
	ctx := context.Background()
	if es, err := st.LedgerEntries(ctx, id); err != nil {
		held = append(held, "ledger: "+err.Error())
	} else {
		for _, e := range es {
			held = append(held, fmt.Sprintf("ledger entry %s %s", e.Kind, e.Key))
		}
	}
	if ranges, err := st.IDRanges(ctx); err == nil {
		if slot, ok := ranges[id]; ok {
			held = append(held, fmt.Sprintf("user namespace range %d", slot))
		}
	}
	if ls, err := st.ListLeases(ctx); err == nil {
		for _, l := range ls {
			if l.SandboxID == id {
				held = append(held, "network lease "+l.IP)
			}
		}
	}
	if xs, err := st.ListPortExposures(ctx); err == nil {
		for _, x := range xs {
			if x.SandboxID == id {
				held = append(held, fmt.Sprintf("port exposure %d", x.Port))
			}
		}
	}
	return held
}

// loopDevices maps loop devices to their backing files.
func loopDevices(t *testing.T) map[string]string {
	devs, err := storage.LoopDevices()
	if err != nil {
		t.Errorf("list loop devices: %v", err)
	}
	return devs
}

// previewGet GETs url through the daemon's preview listener, which listens
// on the simulated host's loopback: the connection is made from inside
// that namespace.
func (r *rig) previewGet(ctx context.Context, url, header, token string) (int, error) {
	tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
		return dialIn(r.tp.HostNS, network, addr)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(header, token)
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// dialIn connects from inside network namespace ns: the socket is made on
// this goroutine's thread while it is in ns, then the thread goes back. A
// thread that cannot go back stays locked, so Go retires it.
func dialIn(ns netns.NsHandle, network, addr string) (net.Conn, error) {
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		goruntime.UnlockOSThread()
		return nil, err
	}
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if serr := netns.Set(orig); serr != nil {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("back to the test's namespace: %w", serr)
	}
	goruntime.UnlockOSThread()
	return c, err
}

// percentile returns the p-th percentile (0..100, nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// isTimeout reports whether err is a client's own deadline running out.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded)
}
