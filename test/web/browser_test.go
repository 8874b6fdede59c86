// Package web tests the web editor in a real browser: Debian's chromium,
// headless, driven with chromedp against a real daemon (testenv.Daemon) that
// serves the embedded bundle. Screenshots go to each test's artifact
// directory (go test -artifacts; `make test` passes it) and, when
// SANDBOXD_WEB_SCREENSHOTS names a directory, are copied there too.
package web

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// chromiumFlags are the flags of every browser the tests start: headless,
// no sandbox (root), and nothing that reaches the network by itself.
var chromiumFlags = []chromedp.ExecAllocatorOption{
	chromedp.Headless,
	chromedp.NoSandbox,
	chromedp.DisableGPU,
	chromedp.NoFirstRun,
	chromedp.NoDefaultBrowserCheck,
	chromedp.Flag("disable-quic", true),
	chromedp.Flag("disable-background-networking", true),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-sync", true),
	chromedp.Flag("disable-default-apps", true),
	chromedp.Flag("disable-extensions", true),
	chromedp.Flag("disable-dev-shm-usage", true),
	chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter"),
	chromedp.WindowSize(1440, 900),
}

// Browser is one headless chromium with a fresh profile.
type Browser struct {
	t         *testing.T
	ctx       context.Context
	Downloads string
	shots     string

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
	answer  string   // what the next prompt() is answered with
	dialogs []string // messages of the dialogs accepted so far
}

// Answer sets the text that the page's prompt() dialogs get; every dialog
// (prompt, confirm, beforeunload) is accepted.
func (b *Browser) Answer(text string) {
	b.mu.Lock()
	b.answer = text
	b.mu.Unlock()
}

// Exceptions returns the page's uncaught exceptions so far.
func (b *Browser) Exceptions() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.console {
		if m.IsException() {
			out = append(out, m.Text)
		}
	}
	return out
}

// newBrowser starts chromium; it is stopped when the test ends.
func newBrowser(t *testing.T) *Browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/install-deps.sh installs it): %v", err)
	}
	profile, err := os.MkdirTemp("", "sandboxd-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.UserDataDir(profile)}, chromiumFlags...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	b := &Browser{t: t, ctx: ctx, Downloads: t.TempDir(), shots: t.ArtifactDir()}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		// Chromium's children may still write to the profile for a moment.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// Start it, and let downloads land in b.Downloads under their own names.
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: b.Downloads,
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// Dialogs: accepted, prompts answered with b.answer.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.mu.Lock()
			answer := b.answer
			b.dialogs = append(b.dialogs, ev.Message)
			b.mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true, PromptText: answer})
		}
	}()
	// The page's console: logged with the test, exceptions fail it.
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, m := range b.console {
			t.Logf("browser console: %s", m)
			if m.IsException() {
				t.Errorf("uncaught exception in the page: %s", m.Text)
			}
		}
	})
	return b
}

// Do runs actions with a deadline, failing the test on error.
func (b *Browser) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.Screenshot("failed-" + strings.ReplaceAll(what, " ", "-"))
		b.t.Fatalf("%s: %v", what, err)
	}
}

// Eval evaluates a JavaScript expression and decodes its value.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// WaitFor evaluates a JavaScript predicate every 20 ms until it is true, or
// fails the test after timeout with a screenshot. (A loop of evaluations
// rather than chromedp.Poll, whose page-side task does not survive the
// navigations of the login redirect.)
func (b *Browser) WaitFor(what, predicate string, timeout time.Duration) {
	b.t.Helper()
	var lastErr error
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+predicate+")"))
		cancel()
		if err == nil && ok {
			return
		}
		lastErr = err
	}
	b.Screenshot("failed-" + strings.ReplaceAll(what, " ", "-"))
	b.t.Fatalf("waiting for %s: %s still false after %v (last error: %v)", what, predicate, timeout, lastErr)
}

// Type inserts text at the focus, as a paste or an input method would.
func (b *Browser) Type(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: text})
		return err
	})
}

// Screenshot saves the page as NAME.png in the test's artifact directory
// (and SANDBOXD_WEB_SCREENSHOTS) and returns its path.
func (b *Browser) Screenshot(name string) string {
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	p := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Errorf("screenshot %s: %v", name, err)
	}
	if dir := os.Getenv("SANDBOXD_WEB_SCREENSHOTS"); dir != "" {
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	}
	b.t.Logf("screenshot: %s", p)
	return p
}
