package autofix

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// maxCommandAnswer caps what the command provider reads from the fixer's
// stdout; more is an error (a fixer is untrusted input).
const maxCommandAnswer = 8 << 20

// CommandProvider runs a fixer program on the host (for example `claude -p`
// or a script): the prompt on its stdin, the answer on its stdout. It runs
// in a process group of its own, killed whole when the call's time ends.
//
// Security boundary: the program runs with the daemon's privileges and
// environment, outside any sandbox — it is configured by the administrator
// (autofix.command), never by a caller.
type CommandProvider struct {
	Argv []string
	// Timeout bounds one call (0: only the loop's deadline).
	Timeout time.Duration
	// Env, if not nil, replaces the daemon's environment.
	Env []string
}

// Name is "command".
func (p *CommandProvider) Name() string { return "command" }

// Fix runs the program once.
func (p *CommandProvider) Fix(ctx context.Context, req *FixRequest) (*Answer, error) {
	if len(p.Argv) == 0 {
		return nil, errors.New("no command configured (autofix.command)")
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, p.Argv[0], p.Argv[1:]...)
	cmd.Env = lifetime.Inherit(p.Env)
	cmd.Stdin = strings.NewReader(req.Prompt())
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxCommandAnswer, 64<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Dies with the daemon (the group's other members carry its marker).
	cmd.SysProcAttr = lifetime.DieWithParent()
	cmd.SysProcAttr.Setpgid = true
	// The fixer may start children (a shell script does): kill the whole
	// group, and stop waiting for its pipes soon after.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s: %w", p.Argv[0], ctx.Err())
	}
	if err != nil {
		msg := strings.TrimSpace(tail(stderr.String(), 500))
		if msg != "" {
			return nil, fmt.Errorf("%s: %v: %s", p.Argv[0], err, msg)
		}
		return nil, fmt.Errorf("%s: %v", p.Argv[0], err)
	}
	if stdout.over {
		return nil, fmt.Errorf("%s: answer longer than %d bytes", p.Argv[0], maxCommandAnswer)
	}
	return &Answer{Text: stdout.String()}, nil
}

// limitedBuffer keeps up to max bytes and notes that there was more.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	room := b.max - b.Len()
	if len(p) > room {
		b.over = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}
