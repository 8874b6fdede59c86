package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// What only a VM (a sandbox of backend vm, made with sandbox_create) can
// do has tools of its own, named for what they do: sandbox_screenshot (any
// sandbox with a screen) and vm_test (a project tested in a clean guest it
// boots). Everything else a VM does is the sandbox tools'.

// vmTestOut is vm_test's outcome; the screenshot travels as an image
// content block, not base64 in the structured content.
type vmTestOut struct {
	apitypes.VMTestResult
	Screenshot    []byte `json:"-"`
	HasScreenshot bool   `json:"has_screenshot"`
	Note          string `json:"note,omitempty"`
}

func (s *srv) addVMTools() {
	addTool[sandboxIDIn, apitypes.ScreenshotResult](s, "sandbox_screenshot", "Screenshot a sandbox",
		"Take a screenshot of a live sandbox's display — a VM's (sandbox_create {backend: vm}) text console, or the desktop of a graphical guest — returned as a PNG image content block. A sandbox without a screen (a container) answers unavailable naming the screenshot capability.",
		annotations{readOnly: true},
		func(ctx context.Context, c *call, in *sandboxIDIn) (*result, error) {
			png, err := s.e.ScreenshotSandbox(ctx, in.SandboxID)
			if err != nil {
				return nil, err
			}
			out := apitypes.ScreenshotResult{SandboxID: in.SandboxID, MIMEType: "image/png", SizeBytes: len(png)}
			return &result{structured: out, text: fmt.Sprintf("screenshot of sandbox %s (%d bytes PNG)", in.SandboxID, len(png)),
				extra: []mcp.Content{mcp.NewImageContent(base64.StdEncoding.EncodeToString(png), "image/png")}}, nil
		})

	addTool[apitypes.VMTestRequest, vmTestOut](s, "vm_test", "Test a project in a clean VM",
		joinLines(
			"Boot a clean VM, copy files into it, run the setup commands and then the test commands (shell lines, in /workspace, in order; the first that fails ends the run), and terminate the VM. Returns passed, every step (phase, command, exit_code, stdout, stderr, duration), the index of the failed step, the VM's sandbox_id, a run_id (run_get) and, when a step failed, a screenshot of the VM (an image).",
			"image python has pytest: e.g. {image: python, files: {...}, test: [\"python3 -m pytest -q\"]}.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.VMTestRequest) (*result, error) {
			res, err := s.e.VMTest(ctx, *in)
			if err != nil {
				return nil, err
			}
			png := res.Screenshot
			res.Screenshot = nil
			r := s.fit(func(limit int) *result {
				out := vmTestOut{VMTestResult: *res, HasScreenshot: len(png) > 0}
				out.Steps = make([]apitypes.VMTestStep, len(res.Steps))
				per := limit / (2*len(res.Steps) + 1)
				cutAny := false
				var text strings.Builder
				fmt.Fprintf(&text, "vm_test in VM sandbox %s: passed %v (run %s)\n", res.SandboxID, res.Passed, res.RunID)
				for i, st := range res.Steps {
					var c1, c2 bool
					st.Stdout, c1 = cut(st.Stdout, per, "the run record keeps it (run_get)")
					st.Stderr, c2 = cut(st.Stderr, per, "the run record keeps it (run_get)")
					cutAny = cutAny || c1 || c2
					out.Steps[i] = st
					fmt.Fprintf(&text, "%s %q: exit %d (%s)\n", st.Phase, st.Command, st.ExitCode, st.Termination.Cause)
				}
				if cutAny {
					out.Note = "output was cut; run_get " + res.RunID + " has all of it"
				}
				return &result{structured: out, text: text.String()}
			})
			if len(png) > 0 {
				r.extra = []mcp.Content{mcp.NewImageContent(base64.StdEncoding.EncodeToString(png), "image/png")}
			}
			return r, nil
		})
}

// withSessionLabel returns labels plus the MCP session's label, so that
// what a session creates (sandboxes, VMs) ends with it under
// server.mcp_on_session_end: terminate.
func (c *call) withSessionLabel(labels map[string]string) map[string]string {
	out := maps.Clone(labels)
	if c.session != "" {
		if out == nil {
			out = map[string]string{}
		}
		out[SessionLabel] = c.session
	}
	return out
}
