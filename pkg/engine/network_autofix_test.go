package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// flaskModule is the "flask" the upstream index serves: just what the app
// below uses (Flask, route, test_client().get(path).data).
const flaskModule = `class Flask:
    def __init__(self, name):
        self.views = {}

    def route(self, path):
        def register(view):
            self.views[path] = view
            return view
        return register

    def test_client(self):
        return _Client(self)


class _Response:
    def __init__(self, body):
        self.status_code = 200
        self.data = body.encode()


class _Client:
    def __init__(self, app):
        self.app = app

    def get(self, path):
        return _Response(self.app.views[path]())
`

// The seed scenario of the autofix loop, with the network topology: a
// Flask app whose requirements.txt lacks flask fails with
// ModuleNotFoundError; the fixer adds flask to requirements.txt; the loop
// installs it from the upstream package index over the sandbox's egress
// network and the app's test passes.
func TestAutofixFlaskFromPackageIndex(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t, indexPackage{"flask", "3.0.0", flaskModule})
	ensureImages(t, "python")
	dir, cmd := scriptedFixer(t, "requirements.txt is missing flask:\n\n"+
		"```diff\n--- a/requirements.txt\n+++ b/requirements.txt\n@@ -1 +1,2 @@\n # the app's dependencies\n+flask\n```\n")
	var env *testEnv
	testenv.InNamespace(t, tp.HostNS, func() {
		env = newRunEngine(t, []string{"python"}, upstreamNetwork("sbxt3"), commandFixer(cmd))
	})
	files := map[string]string{
		"app.py": "from flask import Flask\n\napp = Flask(__name__)\n\n\n@app.route('/')\n" +
			"def hello():\n    return 'Hello from the sandbox'\n\n\nif __name__ == '__main__':\n    print(hello())\n",
		"test_app.py":      "from app import app\n\n\ndef test_hello():\n    assert app.test_client().get('/').data == b'Hello from the sandbox'\n",
		"requirements.txt": "# the app's dependencies\n",
	}
	start := time.Now()
	res, err := env.Autofix(context.Background(), AutofixRequest{Language: "python", Files: files, Entrypoint: "app.py",
		Success: apitypes.SuccessTests, Network: NetworkEgress}, AutofixOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("autofix with egress, two attempts: %v", time.Since(start))
	if !res.Success || res.Status != apitypes.AutofixFixed || res.Attempts != 2 {
		t.Fatalf("status %s (%s: %s) after %d attempts, want fixed after 2\n%+v", res.Status, res.StopReason, res.Error, res.Attempts, res.History)
	}
	fixed := checkAutofixRecord(t, env, res, files)
	if !strings.Contains(fixed[0].Error, "ModuleNotFoundError: No module named 'flask'") {
		t.Errorf("attempt 1 error: %q", fixed[0].Error)
	}
	if !strings.Contains(fixed[0].Fix, "+++ b/requirements.txt") || !strings.Contains(fixed[0].Fix, "\n+flask\n") {
		t.Errorf("attempt 1 fix does not add flask to requirements.txt:\n%s", fixed[0].Fix)
	}
	if prompt, _ := os.ReadFile(filepath.Join(dir, "prompt.1")); !strings.Contains(string(prompt), "No module named 'flask'") {
		t.Errorf("the fixer's prompt lacks the error:\n%s", prompt)
	}
	// Attempt 2 installed flask from the upstream index, ran the app and
	// passed its test.
	if n := tp.wheelDownloads("flask", "3.0.0"); n != 1 {
		t.Errorf("the index served the flask wheel %d times, want 1", n)
	}
	names := stepNames(res.LastResult)
	if len(names) != 3 || names[0] != StepInstall || names[1] != StepRun || names[2] != "test" {
		t.Fatalf("attempt 2 steps %v", names)
	}
	if install := res.LastResult.Steps[0]; install.ExitCode != 0 {
		t.Errorf("install step: %+v", install)
	}
	if run := res.LastResult.Steps[1]; run.ExitCode != 0 || run.Stdout != "Hello from the sandbox\n" {
		t.Errorf("run step: %+v", run)
	}
	if test := res.LastResult.Steps[2]; test.ExitCode != 0 || !strings.Contains(test.Stdout, "1 passed") {
		t.Errorf("test step: %+v", test)
	}
	if res.Files["requirements.txt"] != "# the app's dependencies\nflask\n" {
		t.Errorf("final requirements.txt %q", res.Files["requirements.txt"])
	}
	if ids := env.sandboxes.IDs(); len(ids) != 0 {
		t.Errorf("live sandboxes after the loop: %v", ids)
	}
}
