package engine

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/seccomp"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkSandboxLifecycle measures, in one run, the engine's create→ready,
// exec of `true` in a ready sandbox and terminate, next to Debian's runc CLI
// on an equivalent bundle (same image, overlay, mounts, namespaces, cgroup
// limits, seccomp profile and capabilities): `runc run` of `true` (a whole
// lifecycle) and `runc exec` of `true` into a running container.
// Run with: make bench (or go test -tags seccomp -run '^$' -bench Lifecycle -benchtime 20x ./pkg/engine).
func BenchmarkSandboxLifecycle(b *testing.B) {
	requireRoot(b)
	runcPath, err := exec.LookPath("runc")
	if err != nil {
		b.Fatal("runc CLI not found (scripts/install-deps.sh installs Debian's runc)")
	}
	env := newTestEngine(b, func(c *config.Config) {
		// As test/e2e's benchmarks: the default's favordynmods only when
		// asked (host-wide, never cleared).
		c.Sandbox.CgroupFavorDynMods = os.Getenv("SANDBOXD_BENCH_FAVORDYNMODS") == "1"
		// SANDBOXD_BENCH_LANDLOCK=off measures the same build without
		// the Landlock layer (its cost on create and exec).
		if m := os.Getenv("SANDBOXD_BENCH_LANDLOCK"); m != "" {
			c.Sandbox.Landlock = m
		}
	})
	ctx := context.Background()

	var create, execTrue, terminate, runcRun, runcExec []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: []string{"true"}}, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v %+v", err, res)
		}
		t2 := time.Now()
		if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		create, execTrue, terminate = append(create, t1.Sub(t0)), append(execTrue, t2.Sub(t1)), append(terminate, t3.Sub(t2))
	}

	bundle := newRuncBundle(b, env, []string{"/bin/true"})
	for i := 0; i < b.N; i++ {
		id := "bench-run-" + randHex(4)
		t0 := time.Now()
		out, err := exec.Command(runcPath, "--root", bundle.root, "run", "--bundle", bundle.dir, id).CombinedOutput()
		if err != nil {
			b.Fatalf("runc run: %v\n%s", err, out)
		}
		runcRun = append(runcRun, time.Since(t0))
	}
	// runc exec needs a running container: the same bundle with a long sleep.
	sleeper := newRuncBundle(b, env, []string{"/bin/sleep", "3600"})
	id := "bench-exec-" + randHex(4)
	// The detached container keeps runc's stdio: give it a file, not a pipe
	// that would never reach EOF.
	logf, err := os.Create(filepath.Join(sleeper.dir, "runc.log"))
	if err != nil {
		b.Fatal(err)
	}
	run := exec.Command(runcPath, "--root", sleeper.root, "run", "-d", "--bundle", sleeper.dir, id)
	run.Stdout, run.Stderr = logf, logf
	err = run.Run()
	logf.Close()
	if err != nil {
		out, _ := os.ReadFile(filepath.Join(sleeper.dir, "runc.log"))
		b.Fatalf("runc run -d: %v\n%s", err, out)
	}
	b.Cleanup(func() {
		_ = exec.Command(runcPath, "--root", sleeper.root, "delete", "-f", id).Run()
	})
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if out, err := exec.Command(runcPath, "--root", sleeper.root, "exec", id, "/bin/true").CombinedOutput(); err != nil {
			b.Fatalf("runc exec: %v\n%s", err, out)
		}
		runcExec = append(runcExec, time.Since(t0))
	}

	// podman, when installed: a whole `podman run --rm --rootfs` of the
	// bundle's root. On hybrid-cgroup hosts it needs runc (crun refuses
	// them) and explicit limits (root may lack CAP_SYS_RESOURCE there).
	if podman, err := exec.LookPath("podman"); err == nil {
		var podmanRun []time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			out, err := exec.Command(podman, "run", "--rm", "--runtime", "runc", "--network", "none",
				"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--rootfs", bundle.rootfs, "/bin/true").CombinedOutput()
			if err != nil {
				b.Fatalf("podman run: %v\n%s", err, out)
			}
			podmanRun = append(podmanRun, time.Since(t0))
		}
		b.ReportMetric(ms(median(podmanRun)), "podman-run-ms")
	}

	lifecycle := median(create) + median(execTrue) + median(terminate)
	b.ReportMetric(ms(median(create)), "create-ms")
	b.ReportMetric(ms(median(execTrue)), "exec-ms")
	b.ReportMetric(ms(median(terminate)), "terminate-ms")
	b.ReportMetric(ms(median(runcRun)), "runc-run-ms")
	b.ReportMetric(ms(median(runcExec)), "runc-exec-ms")
	b.ReportMetric(ms(lifecycle)/ms(median(runcRun)), "lifecycle/runc-run")
	b.ReportMetric(ms(median(execTrue))/ms(median(runcExec)), "exec/runc-exec")
	b.ReportMetric(0, "ns/op") // the per-phase medians above are the result
}

type runcBundle struct{ dir, root, rootfs string }

// newRuncBundle writes an OCI bundle equivalent to a sandbox: the spec comes
// from runtime.BuildSpec with the same limits, binds and seccomp profile.
func newRuncBundle(b *testing.B, env *testEnv, args []string) runcBundle {
	b.Helper()
	img, err := env.images.Get("shell")
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("/run", "sbxb-")
	if err != nil {
		b.Fatal(err)
	}
	disk := filepath.Join(dir, "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = image.ReleaseDir(dir) })
	if err := storage.MountMemory(disk, int64(env.cfg.Sandbox.Disk), storage.DefaultInodes(int64(env.cfg.Sandbox.Disk))); err != nil {
		b.Fatal(err)
	}
	layers, err := image.PrepareLayers(img, filepath.Join(dir, "layers"), disk, env.cfg.Sandbox.User, env.cfg.Sandbox.User)
	if err != nil {
		b.Fatal(err)
	}
	prof, err := seccomp.Load(env.cfg.Paths.SeccompDir, env.cfg.Sandbox.SeccompProfile, runtime.AgentCapabilities)
	if err != nil {
		b.Fatal(err)
	}
	agentDir := filepath.Join(dir, "agent")
	if err := os.MkdirAll(agentDir, 0o700); err != nil {
		b.Fatal(err)
	}
	spec := runtime.BuildSpec(&runtime.Spec{
		ID: "bench", Rootfs: layers.Rootfs,
		Binds: []runtime.Bind{
			{Source: layers.Workspace, Destination: "/workspace"},
			{Source: layers.Tmp, Destination: "/tmp"},
			{Source: env.cfg.Paths.AgentPath, Destination: "/.sandboxd/agent", ReadOnly: true},
			{Source: agentDir, Destination: "/.sandboxd/run", NoExec: true},
		},
		CgroupPath: filepath.Join(env.cfg.Sandbox.CgroupParent, "runc-bench-"+randHex(3)),
		Limits:     runtime.Limits{MemoryBytes: int64(env.cfg.Sandbox.Memory), CPUs: env.cfg.Sandbox.CPUs, Pids: env.cfg.Sandbox.Pids},
		Seccomp:    prof, InitArgs: args, InitEnv: []string{"PATH=/usr/bin:/bin"},
	})
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		b.Fatal(err)
	}
	return runcBundle{dir: dir, root: filepath.Join(dir, "runc-state"), rootfs: layers.Rootfs}
}
