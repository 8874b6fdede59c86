package mcpserver

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestVolumeAndTemplateTools drives the volume and template tools over
// streamable HTTP against a real engine: a volume mounted by a template's
// sandbox (its start command ready) keeps a file for the next sandbox, a
// delete while mounted is an error result naming failed_precondition and
// the sandbox, and the listings show what exists.
func TestVolumeAndTemplateTools(t *testing.T) {
	testenv.RequireRoot(t)
	e := newEngine(t)
	c := newClient(t, e, Options{})
	v := ok[apitypes.Volume](c, "volume_create", map[string]any{"name": "notes", "size_mb": 32})
	// A failure part-way leaves the volume behind the engine's own cleanup,
	// which terminates sandboxes but keeps volumes (they outlive sandboxes by
	// design); this cleanup runs first (LIFO), so the volume is free to go.
	t.Cleanup(func() {
		ctx := context.Background()
		list, err := e.ListSandboxes(ctx, "")
		if err != nil {
			t.Error(err)
		}
		for _, sb := range list {
			_, _ = e.TerminateSandbox(ctx, sb.ID)
		}
		_ = e.DeleteTemplate(ctx, "marker")
		_ = e.DeleteVolume(ctx, "notes")
	})
	if v.Name != "notes" || v.SizeBytes != 32<<20 {
		t.Fatalf("volume_create: %+v", v)
	}
	ok[apitypes.Template](c, "template_create", map[string]any{"name": "marker", "image": "shell",
		"start_command": "touch /tmp/started; exec sleep 3600", "ready": map[string]any{"command": "test -e /tmp/started"}})
	sb := ok[apitypes.Sandbox](c, "sandbox_create", map[string]any{"template": "marker",
		"volumes": []map[string]any{{"name": "notes", "path": "/data"}}})
	if sb.Template != "marker" || len(sb.Volumes) != 1 || sb.Volumes[0].Path != "/data" {
		t.Fatalf("sandbox_create: %+v", sb)
	}
	res := ok[apitypes.ExecResult](c, "exec_command", map[string]any{"sandbox_id": sb.ID, "command": "test -e /tmp/started && echo kept > /data/n && cat /data/n"})
	if res.ExitCode != 0 || res.Stdout != "kept\n" {
		t.Fatalf("exec: %+v", res)
	}
	del := c.call("volume_delete", map[string]any{"name": "notes"}, nil)
	if !del.IsError || !strings.Contains(text(del), "failed_precondition") || !strings.Contains(text(del), sb.ID) {
		t.Errorf("volume_delete while mounted: %s", text(del))
	}
	if l := ok[apitypes.VolumeList](c, "volume_list", map[string]any{}); len(l.Volumes) != 1 || len(l.Volumes[0].UsedBy) != 1 {
		t.Errorf("volume_list: %+v", l)
	}
	if l := ok[apitypes.TemplateList](c, "template_list", map[string]any{}); len(l.Templates) != 1 || l.Templates[0].Name != "marker" {
		t.Errorf("template_list: %+v", l)
	}
	ok[apitypes.SandboxState](c, "sandbox_terminate", map[string]any{"sandbox_id": sb.ID})
	next := ok[apitypes.Sandbox](c, "sandbox_create", map[string]any{"language": "shell",
		"volumes": []map[string]any{{"name": "notes", "path": "/mnt/notes", "read_only": true}}})
	if res := ok[apitypes.ExecResult](c, "exec_command", map[string]any{"sandbox_id": next.ID, "command": "cat /mnt/notes/n"}); res.Stdout != "kept\n" {
		t.Errorf("the next sandbox reads %q", res.Stdout)
	}
	bad := c.call("sandbox_create", map[string]any{"language": "shell", "volumes": []map[string]any{{"name": "notes", "path": "/proc/self"}}}, nil)
	if !bad.IsError || !strings.Contains(text(bad), "volumes[0].path") {
		t.Errorf("mount over /proc: %s", text(bad))
	}
	ok[apitypes.SandboxState](c, "sandbox_terminate", map[string]any{"sandbox_id": next.ID})
	if d := ok[apitypes.VolumeDeleteResult](c, "volume_delete", map[string]any{"name": "notes"}); !d.Deleted {
		t.Errorf("volume_delete: %+v", d)
	}
	if d := ok[apitypes.TemplateDeleteResult](c, "template_delete", map[string]any{"name": "marker"}); !d.Deleted {
		t.Errorf("template_delete: %+v", d)
	}
}
