package api

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// run_task and packages_install over REST (what the gateway's MCP engine
// calls): the sandbox is the path's, the request reaches the engine whole,
// and a body naming another sandbox is refused, naming the field.
func TestTaskRoutes(t *testing.T) {
	f := &fakeEngine{}
	hs := newFakeServer(t, f)
	if st, b := do(t, hs, "POST", "/v1/sandboxes/sb-1/tasks", `{"task":"lint","path":"src","timeout_seconds":5}`); st != http.StatusOK {
		t.Fatalf("tasks: %d %s", st, b)
	}
	if r := f.taskReq; r.SandboxID != "sb-1" || r.Task != "lint" || r.Path != "src" || r.TimeoutSeconds == nil || *r.TimeoutSeconds != 5 {
		t.Errorf("engine got %+v", r)
	}
	if st, b := do(t, hs, "POST", "/v1/sandboxes/sb-1/packages", `{"manager":"pip","packages":["six","attrs"]}`); st != http.StatusOK {
		t.Fatalf("packages: %d %s", st, b)
	}
	if r := f.pkgReq; r.SandboxID != "sb-1" || r.Manager != "pip" || !slices.Equal(r.Packages, []string{"six", "attrs"}) {
		t.Errorf("engine got %+v", r)
	}
	for path, body := range map[string]string{
		"/v1/sandboxes/sb-1/tasks":    `{"sandbox_id":"sb-2","task":"lint"}`,
		"/v1/sandboxes/sb-1/packages": `{"sandbox_id":"sb-2","manager":"pip","packages":["six"]}`,
	} {
		st, b := do(t, hs, "POST", path, body)
		if st != http.StatusBadRequest || !strings.Contains(string(b), `sandbox_id: \"sb-2\" in the body contradicts`) {
			t.Errorf("%s naming another sandbox: %d %s, want 400 naming sandbox_id", path, st, b)
		}
		if st, b := do(t, hs, "POST", path, `{"task":`); st != http.StatusBadRequest || !strings.Contains(string(b), "invalid_argument") {
			t.Errorf("%s with truncated JSON: %d %s, want 400", path, st, b)
		}
	}
}
