package engine

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

// mustExec runs command in sandbox id and fails the test unless it exits 0.
func mustExec(t *testing.T, e *Engine, id, command string) string {
	t.Helper()
	res, err := e.Exec(context.Background(), ExecRequest{SandboxID: id, Command: command}, nil)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", command, id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: exit %d, stdout %q, stderr %q", command, id, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// TestVolumes: a volume is shared by two live sandboxes (each sees the
// other's writes at once; one mounts it read-only and cannot write), its
// size limit holds, delete is refused while a sandbox mounts it, a
// snapshot of a sandbox names the volume it left out, and after both
// sandboxes are gone and the engine restarted a third sandbox reads what
// they wrote. gc never touches it; delete leaves nothing.
func TestVolumes(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	env := newTestEngine(t)
	cfg := env.cfg

	vol, err := env.CreateVolume(ctx, apitypes.VolumeCreateRequest{Name: "shared", SizeMB: ptr[int64](32)})
	if err != nil {
		t.Fatal(err)
	}
	if vol.SizeBytes != 32<<20 || vol.Inodes != storage.DefaultInodes(32<<20) {
		t.Errorf("volume = %+v", vol)
	}
	if _, err := env.CreateVolume(ctx, apitypes.VolumeCreateRequest{Name: "shared"}); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Errorf("second create of shared: %v, want conflict", err)
	}

	a, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell",
		Volumes: []apitypes.VolumeMount{{Name: "shared", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell",
		Volumes: []apitypes.VolumeMount{{Name: "shared", Path: "/workspace/shared"}}})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell",
		Volumes: []apitypes.VolumeMount{{Name: "shared", Path: "/mnt/ro", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Volumes) != 1 || a.Volumes[0] != (apitypes.VolumeMount{Name: "shared", Path: "/data"}) {
		t.Errorf("sandbox a volumes = %+v", a.Volumes)
	}

	// Concurrent writers: each sees the other's file at once, owned by
	// the sandbox user in both (idmapped per sandbox).
	mustExec(t, env.Engine, a.ID, "echo from-a > /data/a.txt")
	mustExec(t, env.Engine, b.ID, "echo from-b > /workspace/shared/b.txt")
	if got := mustExec(t, env.Engine, a.ID, "cat /data/b.txt; stat -c %u /data/b.txt"); got != "from-b\n"+strconv.Itoa(cfg.Sandbox.User)+"\n" {
		t.Errorf("a reads b's write: %q", got)
	}
	if got := mustExec(t, env.Engine, b.ID, "cat /workspace/shared/a.txt"); got != "from-a\n" {
		t.Errorf("b reads a's write: %q", got)
	}
	if got := mustExec(t, env.Engine, ro.ID, "cat /mnt/ro/a.txt /mnt/ro/b.txt"); got != "from-a\nfrom-b\n" {
		t.Errorf("read-only sandbox reads: %q", got)
	}
	res, err := env.Exec(ctx, ExecRequest{SandboxID: ro.ID, Command: "echo x > /mnt/ro/c.txt"}, nil)
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
		t.Errorf("write to a read-only volume: %+v, %v", res, err)
	}

	// The size limit: 32 MiB, so 40 MiB do not fit; the sandbox's own
	// disk (1 GiB) is not what fills.
	res, err = env.Exec(ctx, ExecRequest{SandboxID: a.ID, Command: "dd if=/dev/zero of=/data/big bs=1M count=40 conv=fsync"}, nil)
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Errorf("40 MiB into a 32 MiB volume: %+v, %v", res, err)
	}
	mustExec(t, env.Engine, a.ID, "rm /data/big")

	// Delete while mounted: failed_precondition naming every user.
	err = env.DeleteVolume(ctx, "shared")
	if errdefs.CodeOf(err) != errdefs.FailedPrecondition {
		t.Fatalf("delete of a mounted volume: %v, want failed_precondition", err)
	}
	for _, id := range []string{a.ID, b.ID, ro.ID} {
		if !strings.Contains(err.Error(), id) {
			t.Errorf("delete refusal %q does not name %s", err, id)
		}
	}
	got, err := env.GetVolume(ctx, "shared")
	if err != nil || len(got.UsedBy) != 3 || got.UsedBytes == 0 {
		t.Errorf("volume_get while mounted: %+v, %v", got, err)
	}

	// A snapshot says what it left out, and holds none of the volume's files.
	snap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: b.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.ExcludedVolumes) != 1 || snap.ExcludedVolumes[0] != "shared:/workspace/shared" {
		t.Errorf("snapshot excluded_volumes = %v", snap.ExcludedVolumes)
	}
	if listed, err := env.ListSnapshots(ctx, b.ID); err != nil || len(listed) != 1 || len(listed[0].ExcludedVolumes) != 1 {
		t.Errorf("snapshot_list: %+v, %v", listed, err)
	}
	if err := env.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{a.ID, b.ID, ro.ID} {
		if _, err := env.TerminateSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// gc never removes a volume.
	if _, err := env.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := env.GetVolume(ctx, "shared"); err != nil {
		t.Fatalf("volume after gc: %v", err)
	}

	// A restart on the same state: the volume is there and mounted, and
	// the next sandbox reads what the first ones wrote.
	env.sandboxes.Close()
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	e2, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	env.Engine = e2
	c, err := e2.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell",
		Volumes: []apitypes.VolumeMount{{Name: "shared", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, e2, c.ID, "cat /data/a.txt /data/b.txt"); got != "from-a\nfrom-b\n" {
		t.Errorf("after restart: %q", got)
	}
	if _, err := e2.TerminateSandbox(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	list, err := e2.ListVolumes(ctx)
	if err != nil || len(list.Volumes) != 1 || list.Volumes[0].Name != "shared" || len(list.Volumes[0].UsedBy) != 0 {
		t.Errorf("volume_list: %+v, %v", list, err)
	}
	// The volume's files are named by its storage name: its name and a
	// random suffix (names are per tenant).
	imgs, _ := filepath.Glob(filepath.Join(cfg.Volumes.DirOrDefault(cfg.Paths.StateDir), "shared.*.img"))
	if len(imgs) != 1 {
		t.Fatalf("images of shared: %v, want one", imgs)
	}
	img := imgs[0]
	owner := "vol-" + strings.TrimSuffix(filepath.Base(img), ".img")
	if ents, _ := e2.ledger.Resources(ctx, owner); len(ents) == 0 {
		t.Errorf("ledger of %s before delete: empty", owner)
	}
	if err := e2.DeleteVolume(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.GetVolume(ctx, "shared"); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("volume_get after delete: %v, want not_found", err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("image %s after delete: %v", img, err)
	}
	if ents, _ := e2.ledger.Resources(ctx, owner); len(ents) != 0 {
		t.Errorf("ledger after delete: %v", ents)
	}
}

// TestVolumeBadInput: hostile names, paths and sizes are refused with
// invalid_argument naming the field, and leave nothing.
func TestVolumeBadInput(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	env := newTestEngine(t)
	for _, tc := range []struct {
		req   apitypes.VolumeCreateRequest
		field string
	}{
		{apitypes.VolumeCreateRequest{}, "name: required"},
		{apitypes.VolumeCreateRequest{Name: "../etc"}, "name:"},
		{apitypes.VolumeCreateRequest{Name: "a/b"}, "name:"},
		{apitypes.VolumeCreateRequest{Name: "UPPER"}, "name:"},
		{apitypes.VolumeCreateRequest{Name: "-x"}, "name:"},
		{apitypes.VolumeCreateRequest{Name: "a\x00b"}, "name:"},
		{apitypes.VolumeCreateRequest{Name: strings.Repeat("a", 64)}, "name:"},
		{apitypes.VolumeCreateRequest{Name: "ok", SizeMB: ptr[int64](1)}, "size_mb:"},
		{apitypes.VolumeCreateRequest{Name: "ok", SizeMB: ptr[int64](1 << 40)}, "size_mb:"},
		{apitypes.VolumeCreateRequest{Name: "ok", SizeMB: ptr[int64](16), Inodes: ptr[int64](1 << 30)}, "inodes:"},
	} {
		_, err := env.CreateVolume(ctx, tc.req)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("create %+v: %v, want invalid_argument naming %s", tc.req, err, tc.field)
		}
	}
	if _, err := env.CreateVolume(ctx, apitypes.VolumeCreateRequest{Name: "v", SizeMB: ptr[int64](16)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.DeleteVolume(ctx, "v"); err != nil {
			t.Error(err)
		}
	})
	for _, tc := range []struct {
		mounts []apitypes.VolumeMount
		field  string
	}{
		{[]apitypes.VolumeMount{{Name: "v", Path: "/proc"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/proc/sys/kernel"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/sys/fs/cgroup"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/dev/shm"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/.sandboxd/run"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/etc"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/workspace"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/data/../proc"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "data"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/data/"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/da\nta"}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: ""}}, "volumes[0].path"},
		{[]apitypes.VolumeMount{{Name: "v", Path: "/a"}, {Name: "v", Path: "/a/b"}}, "volumes[1].path"},
		{[]apitypes.VolumeMount{{Name: "nosuch", Path: "/data"}}, "volumes[0].name"},
		{[]apitypes.VolumeMount{{Name: "../v", Path: "/data"}}, "volumes[0].name"},
	} {
		_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Volumes: tc.mounts})
		code := errdefs.CodeOf(err)
		if (code != errdefs.InvalidArgument && code != errdefs.NotFound) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("create with %+v: %v, want invalid_argument or not_found naming %s", tc.mounts, err, tc.field)
		}
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Backend: BackendVM, Volumes: []apitypes.VolumeMount{{Name: "v", Path: "/data"}}}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("vm with a volume: %v, want invalid_argument", err)
	}
	if ids := env.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("refused creates left sandboxes %v", ids)
	}
	for _, name := range []string{"", "../v", "nosuch"} {
		if err := env.DeleteVolume(ctx, name); err == nil {
			t.Errorf("delete %q succeeded", name)
		}
	}
}

// TestVolumeNamesPerTenant: volume names are per tenant. Two tenants each
// make a "data" (no conflict, nothing revealed), a tenant's second "data"
// conflicts; each sandbox mounts its own tenant's "data" and neither sees
// the other's files; a tenant cannot name another's volume; an admin sees
// both with their tenant, is told to qualify the ambiguous name and acts
// on "tenant:name"; a delete refused while mounted names only that
// volume's sandbox.
func TestVolumeNamesPerTenant(t *testing.T) {
	requireRoot(t)
	env := newTestEngine(t)
	bg := context.Background()
	as := func(name string, admin bool) context.Context {
		k, err := env.Tenants().Create(bg, apitypes.KeyCreateRequest{Name: name, Admin: admin})
		if err != nil {
			t.Fatal(err)
		}
		p, err := env.Tenants().Authenticate(k.Secret, "127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		return principal.With(bg, p)
	}
	alice, bob, admin := as("alice", false), as("bob", false), as("ops", true)
	for _, ctx := range []context.Context{alice, bob} {
		if _, err := env.CreateVolume(ctx, apitypes.VolumeCreateRequest{Name: "data", SizeMB: ptr[int64](16)}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, n := range []string{"alice:data", "bob:data"} {
			_ = env.DeleteVolume(bg, n)
		}
	}()
	if _, err := env.CreateVolume(alice, apitypes.VolumeCreateRequest{Name: "data"}); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Errorf("alice's second data: %v, want conflict", err)
	}
	sbs := map[string]string{}
	for name, ctx := range map[string]context.Context{"alice": alice, "bob": bob} {
		sb, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Volumes: []apitypes.VolumeMount{{Name: "data", Path: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer env.TerminateSandbox(bg, sb.ID) //nolint:errcheck
		sbs[name] = sb.ID
		mustExec(t, env.Engine, sb.ID, "echo "+name+" > /data/owner")
	}
	for name, id := range sbs {
		if out := mustExec(t, env.Engine, id, "cat /data/owner"); out != name+"\n" {
			t.Errorf("%s's sandbox reads %q from its data, want its own", name, out)
		}
	}
	for _, n := range []string{"alice:data", "alice"} {
		if _, err := env.GetVolume(bob, n); err == nil {
			t.Errorf("bob gets %q: no error", n)
		}
	}
	if _, err := env.GetVolume(bob, "alice:data"); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("bob names alice:data: %v, want invalid_argument", err)
	}
	if l, err := env.ListVolumes(bob); err != nil || len(l.Volumes) != 1 || l.Volumes[0].Tenant != "bob" {
		t.Errorf("bob's list: %+v %v", l, err)
	}
	l, err := env.ListVolumes(admin)
	if err != nil || len(l.Volumes) != 2 {
		t.Fatalf("admin's list: %+v %v", l, err)
	}
	for _, v := range l.Volumes {
		if v.Name != "data" || len(v.UsedBy) != 1 || v.UsedBy[0] != sbs[v.Tenant] {
			t.Errorf("admin sees %+v, want data of %s used by %s", v, v.Tenant, sbs[v.Tenant])
		}
	}
	if _, err := env.GetVolume(admin, "data"); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "tenant:data") {
		t.Errorf("admin gets the ambiguous data: %v, want invalid_argument asking for tenant:data", err)
	}
	if v, err := env.GetVolume(admin, "bob:data"); err != nil || v.Tenant != "bob" {
		t.Errorf("admin gets bob:data: %+v %v", v, err)
	}
	// Hostile qualified names: the name part is checked like any name.
	for n, code := range map[string]errdefs.Code{"alice:": errdefs.InvalidArgument, "alice:../x": errdefs.InvalidArgument,
		"alice:data:x": errdefs.InvalidArgument, ":data": errdefs.NotFound, "../../etc:data": errdefs.NotFound} {
		if _, err := env.GetVolume(admin, n); errdefs.CodeOf(err) != code {
			t.Errorf("admin gets %q: %v, want %s", n, err, code)
		}
	}
	err = env.DeleteVolume(admin, "alice:data")
	if errdefs.CodeOf(err) != errdefs.FailedPrecondition || !strings.Contains(err.Error(), sbs["alice"]) || strings.Contains(err.Error(), sbs["bob"]) {
		t.Errorf("delete of alice's mounted data: %v, want failed_precondition naming %s only", err, sbs["alice"])
	}
	if _, err := env.TerminateSandbox(bg, sbs["alice"]); err != nil {
		t.Fatal(err)
	}
	if err := env.DeleteVolume(alice, "data"); err != nil {
		t.Fatalf("alice deletes her data: %v", err)
	}
	if v, err := env.GetVolume(bob, "data"); err != nil || v.Tenant != "bob" {
		t.Errorf("bob's data after alice's went: %+v %v", v, err)
	}
	// Now unambiguous: the admin's unqualified name finds bob's.
	if v, err := env.GetVolume(admin, "data"); err != nil || v.Tenant != "bob" {
		t.Errorf("admin gets data with one left: %+v %v", v, err)
	}
}
