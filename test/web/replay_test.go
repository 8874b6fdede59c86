package web

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestEditorReplay: the Run record pane's Replay button re-runs a recorded
// run and shows its diff against the original: here a program that prints
// and writes the clock, so stdout and an output file differ, as unified
// diffs with their removed and added lines marked; the replay's record
// links back to the original.
func TestEditorReplay(t *testing.T) {
	testenv.RequireRoot(t)
	d := testenv.NewDaemon(t, "python")
	d.Start()
	body, _ := json.Marshal(map[string]any{"language": "python", "code": "import time\nt = time.time_ns()\nprint('same line')\nprint('now', t)\nopen('output/now.txt', 'w').write(str(t) + '\\n')\n",
		"files": map[string]string{"output/.keep": ""}})
	var orig apitypes.RunResult
	if st, b := rest(t, d, d.Token(), http.MethodPost, "/v1/run", body); st != http.StatusOK || json.Unmarshal(b, &orig) != nil || !orig.Success {
		t.Fatalf("run: %d %s", st, b)
	}

	b := newBrowser(t)
	b.Do("open the login URL", chromedp.Navigate(loginURL(t, d)))
	b.WaitFor("the editor to start", `document.body.dataset.ready === "1"`, 30*time.Second)
	b.WaitFor("the run in the history", `document.querySelector('#runs-list li[data-run="`+orig.RunID+`"]') !== null`, 30*time.Second)
	b.Do("open the run", chromedp.Click(chromedp.CSS(`#runs-list li[data-run="`+orig.RunID+`"]`)))
	b.WaitFor("the Replay button", `document.getElementById("replay-run") !== null`, 15*time.Second)
	b.Do("replay it", chromedp.Click(chromedp.ID("replay-run")))
	b.WaitFor("the replay's diff", `document.querySelector("#replay-diff.differs pre.udiff .add") !== null`, 3*time.Minute)
	text := Eval[string](b, `document.getElementById("replay-diff").textContent`)
	for _, want := range []string{"--- original/stdout", "+++ replay/stdout", "-now ", "+now ", " same line", "--- original/output/now.txt"} {
		if !strings.Contains(text, want) {
			t.Errorf("the replay diff does not show %q:\n%s", want, text)
		}
	}
	if Eval[int](b, `document.querySelectorAll("#replay-diff pre.udiff .del").length`) != 2 || Eval[int](b, `document.querySelectorAll("#replay-diff pre.udiff .add").length`) != 2 {
		t.Errorf("want one removed and one added line in stdout and in now.txt:\n%s", text)
	}
	b.Screenshot("editor-run-replay")

	// The replay's own record names the original.
	replayID := Eval[string](b, `document.querySelector("#replay-diff h4 a").textContent`)
	b.Do("open the replay's record", chromedp.Click(chromedp.CSS("#replay-diff h4 a")))
	b.WaitFor("the replay's record", `document.querySelector("#run-record h3")?.textContent.includes("`+replayID+`")`, 15*time.Second)
	if got := Eval[string](b, `document.querySelector("#run-record a.replay-of")?.textContent ?? ""`); !strings.Contains(got, orig.RunID) {
		t.Errorf("the replay's record links to %q, want the original %s", got, orig.RunID)
	}
	if ex := b.Exceptions(); len(ex) > 0 {
		t.Errorf("page exceptions: %v", ex)
	}
}
