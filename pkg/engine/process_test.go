package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestOpenProcess covers the E2B front end's engine calls: a root-mode
// sandbox whose commands default to the sandbox user (RootAsUser), a
// process on pipes with stdin written and closed, uid 0 on request, uid 0
// refused in a normal sandbox, and SetSandboxTimeout.
func TestOpenProcess(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	sb, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Root: true, RootAsUser: true})
	if err != nil {
		t.Fatal(err)
	}
	run := func(req apitypes.ProcessRequest, stdin string) (stdout, stderr string, res *apitypes.ExecResult) {
		t.Helper()
		req.SandboxID = sb.ID
		p, err := env.OpenProcess(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if stdin != "" {
			if _, err := p.Write([]byte(stdin)); err != nil {
				t.Fatal(err)
			}
		}
		if !req.TTY {
			if err := p.CloseStdin(); err != nil {
				t.Fatal(err)
			}
		}
		for c := range p.Chunks() {
			if c.Stream == "stderr" {
				stderr += string(c.Data)
			} else {
				stdout += string(c.Data)
			}
		}
		if res, err = p.Wait(); err != nil {
			t.Fatal(err)
		}
		return stdout, stderr, res
	}
	out, errOut, res := run(apitypes.ProcessRequest{Argv: []string{"sh", "-c", "id -u; cat; echo err >&2; exit 5"}}, "piped\n")
	if out != "1000\npiped\n" || errOut != "err\n" || res.ExitCode != 5 {
		t.Errorf("default user: %q %q %+v", out, errOut, res)
	}
	// Root of the sandbox's user namespace, with root mode's capabilities
	// (chown needs CAP_CHOWN), although the default user is not 0.
	out, _, _ = run(apitypes.ProcessRequest{Argv: []string{"sh", "-c", "id -u; touch /etc/written && chown 1000 /etc/written && echo ok"}, Root: true}, "")
	if out != "0\nok\n" {
		t.Errorf("root: %q", out)
	}
	out, _, _ = run(apitypes.ProcessRequest{Argv: []string{"sh", "-c", "stty size"}, TTY: true, Rows: 30, Cols: 100}, "")
	if !strings.Contains(out, "30 100") {
		t.Errorf("tty: %q", out)
	}
	// A fast command's output is not lost before the session attaches.
	out, _, _ = run(apitypes.ProcessRequest{Argv: []string{"sh", "-c", "seq 1 20000"}}, "")
	if n := strings.Count(out, "\n"); n != 20000 {
		t.Errorf("fast command: %d lines", n)
	}
	if _, err := env.OpenProcess(ctx, apitypes.ProcessRequest{SandboxID: sb.ID, Argv: []string{"true"}, TTY: true}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("tty without a size: %v", err)
	}

	// uid 0 is the host's root outside root mode: refused.
	plain, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.OpenProcess(ctx, apitypes.ProcessRequest{SandboxID: plain.ID, Argv: []string{"id"}, Root: true}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("root in a normal sandbox: %v", err)
	}

	info, err := env.SetSandboxTimeout(ctx, sb.ID, 600)
	if err != nil || info.ExpiresAt == nil || time.Until(*info.ExpiresAt) < 590*time.Second || time.Until(*info.ExpiresAt) > 601*time.Second {
		t.Errorf("timeout 600: %+v %v", info, err)
	}
	for _, bad := range []int64{0, -5, 1 << 40} {
		if _, err := env.SetSandboxTimeout(ctx, sb.ID, bad); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("timeout %d: %v", bad, err)
		}
	}
	if _, err := env.SetSandboxTimeout(ctx, sb.ID, 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := env.GetSandbox(ctx, sb.ID)
		if err == nil && got.State == apitypes.StateTerminated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 1s timeout did not end the sandbox: %+v %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
