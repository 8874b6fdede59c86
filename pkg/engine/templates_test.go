package engine

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// httpStatus asks the HTTP server on port inside sandbox id for / through
// the sandbox's agent (as the preview relay does) and returns the status.
func httpStatus(ctx context.Context, e *Engine, id string, port int) (int, error) {
	conn, err := e.sandboxes.DialPort(ctx, id, port)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestTemplateStartsReady: a template whose start command serves HTTP;
// sandbox_create {template} returns a sandbox whose port already answers,
// without a pool and from the template's warm pool, whose create time is
// measured (median); bad templates and bad uses are refused; deleting
// the template ends its warm sandboxes.
func TestTemplateStartsReady(t *testing.T) {
	requireRoot(t)
	testenv.EnsureImages(t, "python")
	ctx := context.Background()
	env := newTestEngine(t)
	const port = 8000
	web := apitypes.TemplateCreateRequest{
		Name: "web", Image: "python", MemoryMB: ptr[int64](256),
		StartCommand: fmt.Sprintf("cd /tmp && exec python3 -m http.server %d --bind 127.0.0.1", port),
		Ready:        &apitypes.TemplateReady{Port: port, TimeoutSeconds: 30},
		Env:          map[string]string{"FROM_TEMPLATE": "yes"},
	}
	if _, err := env.CreateTemplate(ctx, web); err != nil {
		t.Fatal(err)
	}

	// Without a pool: the create itself starts the server and waits.
	start := time.Now()
	cold, err := env.CreateSandbox(ctx, CreateSandboxRequest{Template: "web", Env: map[string]string{"MINE": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	coldTime := time.Since(start)
	if st, err := httpStatus(ctx, env.Engine, cold.ID, port); err != nil || st != 200 {
		t.Fatalf("port %d of a fresh template sandbox: %d, %v", port, st, err)
	}
	if cold.Template != "web" || cold.Image != "python" || cold.Limits.MemoryBytes != 256<<20 {
		t.Errorf("template sandbox = template %q image %q memory %d", cold.Template, cold.Image, cold.Limits.MemoryBytes)
	}
	if got := mustExec(t, env.Engine, cold.ID, "echo $FROM_TEMPLATE $MINE"); got != "yes 1\n" {
		t.Errorf("environment: %q", got)
	}
	if _, err := env.TerminateSandbox(ctx, cold.ID); err != nil {
		t.Fatal(err)
	}

	// A warm pool of 2: creates take a ready one.
	pooled := web
	pooled.Name, pooled.Pool = "web-pool", 2
	if _, err := env.CreateTemplate(ctx, pooled); err != nil {
		t.Fatal(err)
	}
	waitWarm := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			tpl, err := env.GetTemplate(ctx, "web-pool")
			if err != nil {
				t.Fatal(err)
			}
			if tpl.Warm >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("template pool: %d warm after 2 minutes, want %d", tpl.Warm, n)
			}
		}
	}
	var times []time.Duration
	for range 9 {
		waitWarm(1)
		warmIDs := env.sandboxes.WarmIDs("template:web-pool")
		start := time.Now()
		sb, err := env.CreateSandbox(ctx, CreateSandboxRequest{Template: "web-pool"})
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start))
		if !slices.Contains(warmIDs, sb.ID) {
			t.Fatalf("create took %s, not one of the warm %v", sb.ID, warmIDs)
		}
		if st, err := httpStatus(ctx, env.Engine, sb.ID, port); err != nil || st != 200 {
			t.Fatalf("port %d of a pooled template sandbox: %d, %v", port, st, err)
		}
		if _, err := env.TerminateSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(times)
	median := times[len(times)/2]
	t.Logf("create from template web: cold (server started, port polled) %v; from the warm pool median %v of %d (min %v, max %v)",
		coldTime, median, len(times), times[0], times[len(times)-1])
	if median >= coldTime {
		t.Errorf("median create from the warm pool %v is not faster than a cold create %v", median, coldTime)
	}

	// Bad templates and bad uses.
	for _, tc := range []struct {
		req   apitypes.TemplateCreateRequest
		field string
	}{
		{apitypes.TemplateCreateRequest{Name: "../x", Image: "python"}, "name:"},
		{apitypes.TemplateCreateRequest{Name: "x"}, "image:"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "nosuch"}, "image:"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", StartCommand: "sleep 1"}, "ready:"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", StartCommand: "s", Ready: &apitypes.TemplateReady{Port: 70000}}, "ready.port"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", StartCommand: "s", Ready: &apitypes.TemplateReady{Port: 1, Command: "true"}}, "ready:"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", Ready: &apitypes.TemplateReady{Command: "true", TimeoutSeconds: 100000}}, "ready.timeout_seconds"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", Pool: 1000}, "pool:"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", MemoryMB: ptr[int64](1)}, "memory_mb"},
		{apitypes.TemplateCreateRequest{Name: "x", Image: "python", Network: "everything"}, "network"},
		{web, "name: template \"web\" exists"},
	} {
		_, err := env.CreateTemplate(ctx, tc.req)
		code := errdefs.CodeOf(err)
		if (code != errdefs.InvalidArgument && code != errdefs.Conflict) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("template %+v: %v, want an error naming %s", tc.req, err, tc.field)
		}
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Template: "nosuch"}); errdefs.CodeOf(err) != errdefs.NotFound || !strings.Contains(err.Error(), "template:") {
		t.Errorf("create from an unknown template: %v", err)
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Template: "web", Language: "shell"}); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "language:") {
		t.Errorf("create from a template with another language: %v", err)
	}
	// A start command that never gets ready: unavailable, nothing left.
	if _, err := env.CreateTemplate(ctx, apitypes.TemplateCreateRequest{Name: "never", Image: "python", StartCommand: "sleep 600",
		Ready: &apitypes.TemplateReady{Port: 9, TimeoutSeconds: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Template: "never"}); errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "ready.timeout_seconds") {
		t.Errorf("create from a template that never gets ready: %v", err)
	}

	list, err := env.ListTemplates(ctx)
	if err != nil || len(list.Templates) != 3 {
		t.Fatalf("template_list: %+v, %v", list, err)
	}
	waitWarm(2)
	for _, name := range []string{"web", "web-pool", "never"} {
		if err := env.DeleteTemplate(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if ids := env.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("sandboxes left after the templates were deleted: %v", ids)
	}
	if _, err := env.GetTemplate(ctx, "web"); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("template_get after delete: %v", err)
	}
}
