package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestDrainPersists: the drain flag written by SetDraining is what a
// restarted engine reads (compose.go), and ending the drain removes it;
// a state directory that cannot be written refuses the drain.
func TestDrainPersists(t *testing.T) {
	dir := t.TempDir()
	if readDrain(dir) {
		t.Fatal("a fresh state directory reads as draining")
	}
	if err := writeDrain(dir, true); err != nil {
		t.Fatal(err)
	}
	if !readDrain(dir) {
		t.Fatal("a drain did not persist")
	}
	if err := writeDrain(dir, true); err != nil {
		t.Fatalf("a second drain: %v", err)
	}
	if err := writeDrain(dir, false); err != nil {
		t.Fatal(err)
	}
	if readDrain(dir) {
		t.Fatal("an ended drain still reads as draining")
	}
	if err := writeDrain(dir, false); err != nil {
		t.Fatalf("ending a drain twice: %v", err)
	}
	if err := writeDrain(filepath.Join(dir, "missing"), true); err == nil || !os.IsNotExist(err) {
		t.Fatalf("a drain in a missing directory: %v", err)
	}
}

// TestNodeMetrics: the gauges the alert rules of deploy/prometheus are
// written over, read from a real engine's registry — the warm pool's size
// and warm count, the free space of the state directory, the audit chain's
// verification at start, and the drain with its start time, which a second
// drain call does not move.
func TestNodeMetrics(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) {
		c.Sandbox.Pool = map[string]int{"shell": 1}
		c.Audit.Enabled = true
		c.Audit.VerifyInterval = config.Duration(time.Hour)
	})
	ctx := context.Background()
	shell := map[string]string{"pool": "shell"}
	waitGauge(t, env, "sandboxd_pool_size", shell, 1)
	waitGauge(t, env, "sandboxd_pool_warm", shell, 1)
	waitGauge(t, env, "sandboxd_audit_chain_ok", nil, 1)

	state := map[string]string{"dir": "state"}
	avail, size := gauge(t, env, "sandboxd_filesystem_avail_bytes", state), gauge(t, env, "sandboxd_filesystem_size_bytes", state)
	var st unix.Statfs_t
	if err := unix.Statfs(env.cfg.Paths.StateDir, &st); err != nil {
		t.Fatal(err)
	}
	if want := float64(st.Blocks) * float64(st.Bsize); size != want || avail <= 0 || avail > size {
		t.Fatalf("state filesystem: avail %v, size %v; statfs size %v", avail, size, want)
	}
	if got := counter(t, env, "sandboxd_sandboxes_created_total", map[string]string{"outcome": "failed"}); got != 0 {
		t.Fatalf("failed creates of a fresh engine: %v", got)
	}
	if !has(t, env, "sandboxd_sandboxes_created_total", map[string]string{"outcome": "failed"}) {
		t.Fatal("sandboxd_sandboxes_created_total{outcome=failed} is not exported before the first failure")
	}

	if got := gauge(t, env, "sandboxd_node_draining", nil); got != 0 {
		t.Fatalf("draining before a drain: %v", got)
	}
	if has(t, env, "sandboxd_node_draining_since_timestamp_seconds", nil) {
		t.Fatal("a drain start time while not draining")
	}
	before := time.Now().Add(-time.Second) // the file's time may be coarser than the clock's
	if _, err := env.SetDraining(ctx, true); err != nil {
		t.Fatal(err)
	}
	since := gauge(t, env, "sandboxd_node_draining_since_timestamp_seconds", nil)
	if got := gauge(t, env, "sandboxd_node_draining", nil); got != 1 || since < float64(before.Unix()) || since > float64(time.Now().Unix()+1) {
		t.Fatalf("draining %v since %v (drain began after %v)", got, since, before)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := env.SetDraining(ctx, true); err != nil {
		t.Fatal(err)
	}
	if again := gauge(t, env, "sandboxd_node_draining_since_timestamp_seconds", nil); again != since {
		t.Fatalf("a second drain call moved the drain's start from %v to %v", since, again)
	}
	if _, err := env.SetDraining(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, env, "sandboxd_node_draining", nil); got != 0 || has(t, env, "sandboxd_node_draining_since_timestamp_seconds", nil) {
		t.Fatalf("after the drain: draining %v, start time still exported", got)
	}
}

// find returns the metric of the engine's registry with name and labels.
func find(t *testing.T, env *testEnv, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := env.MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

func has(t *testing.T, env *testEnv, name string, labels map[string]string) bool {
	t.Helper()
	return find(t, env, name, labels) != nil
}

func gauge(t *testing.T, env *testEnv, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, env, name, labels)
	if m == nil {
		t.Fatalf("%s%v is not exported", name, labels)
	}
	return m.GetGauge().GetValue()
}

// waitGauge waits for a gauge set by background work (the pool's refill,
// the audit log's first verification) to read want.
func waitGauge(t *testing.T, env *testEnv, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a warm sandbox's start on a loaded host
	for time.Now().Before(deadline) {
		if m := find(t, env, name, labels); m != nil && m.GetGauge().GetValue() == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s%v did not reach %v in 2 minutes (now %v)", name, labels, want, find(t, env, name, labels))
}
