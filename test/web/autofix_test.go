package web

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestEditorAutoFix: the AutoFix button runs the loop on the open project
// with the daemon's configured provider (here a scripted `command` fixer on
// the host), shows each attempt live, writes the fixed file back into the
// sandbox and the editor, and opens the loop's run record.
func TestEditorAutoFix(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t, "python")
	answer := filepath.Join(t.TempDir(), "answer.md")
	fixed := "print(\"fixed by the AutoFix button\")\n"
	if err := os.WriteFile(answer, []byte("```python main.py\n"+fixed+"```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Config.Autofix.Provider = "command"
	d.Config.Autofix.Command = []string{"/bin/sh", "-c", `cat >/dev/null; cat "$0"`, answer}
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	b := newBrowser(t)
	b.Do("open the login URL", chromedp.Navigate(loginURL(t, d)))
	b.WaitFor("the editor to start", `document.body.dataset.ready === "1"`, 30*time.Second)
	b.Do("create a sandbox",
		chromedp.SetValue(chromedp.ID("new-sandbox-lang"), "python"),
		chromedp.Click(chromedp.ID("create-sandbox")),
	)
	b.WaitFor("the new sandbox", `document.querySelector("#sandbox-list li.active .state")?.textContent === "ready"`, 90*time.Second)
	sandboxID := Eval[string](b, `document.querySelector("#sandbox-list li.active").dataset.id`)
	b.Do("create main.py",
		chromedp.Click(chromedp.ID("new-file")),
		chromedp.SendKeys(chromedp.ID("new-file-name"), "main.py\r"),
	)
	b.WaitFor("main.py's tab", `document.querySelector('.tab.active[data-path="/workspace/main.py"]') !== null`, 15*time.Second)
	b.Do("type a failing program", chromedp.Click(chromedp.CSS("#editor .view-lines")), b.Type("print(undefined_name)\n"))
	b.WaitFor("the AutoFix button", `!document.getElementById("autofix").disabled`, 10*time.Second)

	b.Do("AutoFix", chromedp.Click(chromedp.ID("autofix")))
	b.WaitFor("the first attempt's error", `document.getElementById("stderr").textContent.includes("NameError")`, 90*time.Second)
	b.WaitFor("the fixed result", `/\[fixed.*2 attempt/.test(document.getElementById("stdout").textContent)`, 90*time.Second)
	if out := Eval[string](b, `document.getElementById("stdout").textContent`); !strings.Contains(out, "fix by command") {
		t.Errorf("the output panel does not show the fix's provider:\n%s", out)
	}
	b.WaitFor("the fixed file in the editor", `document.querySelector("#editor .view-lines").textContent.replace(/\u00a0/g, " ").includes("fixed by the AutoFix button")`, 15*time.Second)
	if got := readFile(t, d, sandboxID, "/workspace/main.py"); got != fixed {
		t.Errorf("main.py in the sandbox after AutoFix = %q, want %q", got, fixed)
	}
	b.Screenshot("editor-autofix")
	if ex := b.Exceptions(); len(ex) > 0 {
		t.Errorf("page exceptions: %v", ex)
	}
}
