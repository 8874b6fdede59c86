package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// maxStdin is the daemon's limit on a command's stdin (engine.maxStdin).
const maxStdin = 16 << 20

type execOptions struct {
	interactive, tty, detach bool
	timeout                  time.Duration
	env                      []string
	cwd                      string
}

func execCmd(g *globals) *cobra.Command {
	var o execOptions
	cmd := &cobra.Command{
		Use:   "exec [-it] [--timeout D] [--env K=V] [--cwd DIR] ID -- CMD ARGS...",
		Short: "Run a command in a sandbox and exit with its exit code",
		Long: `Run a command in a sandbox, streaming its stdout and stderr, and exit with
its exit code (128+N when killed by signal N). -i sends this process's stdin
to the command; -it runs it on a pseudo-terminal attached to this one; -d
starts it in the background and prints its job id (see jobs, logs, kill).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return usagef("exec: missing command after the sandbox ID")
			}
			env, err := parseKV("env", o.env)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			switch {
			case o.detach && (o.tty || o.interactive):
				return usagef("exec: -d cannot be combined with -i or -t")
			case o.detach:
				return execDetached(cmd.Context(), g, c, id, argv, env, o)
			case o.tty:
				return execTTY(cmd.Context(), g, c, id, argv, env, o)
			}
			return execStream(cmd.Context(), g, c, id, argv, env, o)
		},
	}
	f := cmd.Flags()
	// Flags after the ID belong to the command: exec ID ls -la.
	f.SetInterspersed(false)
	f.BoolVarP(&o.interactive, "interactive", "i", false, "send stdin to the command")
	f.BoolVarP(&o.tty, "tty", "t", false, "run on a pseudo-terminal (needs -i and a terminal)")
	f.BoolVarP(&o.detach, "detach", "d", false, "run in the background and print the job id")
	f.DurationVar(&o.timeout, "timeout", 0, "kill the command after this long (default: the daemon's)")
	f.StringArrayVarP(&o.env, "env", "e", nil, "environment variable NAME=VALUE (repeatable)")
	f.StringVarP(&o.cwd, "cwd", "w", "", "working directory (default /workspace)")
	return cmd
}

// request builds the exec request the options describe (without stdin).
func (o execOptions) request(argv []string, env map[string]string) (client.ExecRequest, error) {
	req := client.ExecRequest{Argv: argv, Env: env, Cwd: o.cwd}
	if o.timeout != 0 {
		if o.timeout < 0 {
			return req, usagef("--timeout: must be positive, got %s", o.timeout)
		}
		t := o.timeout.Seconds()
		req.TimeoutSeconds = &t
	}
	return req, nil
}

// execDetached starts the command as a background job and prints its id.
func execDetached(ctx context.Context, g *globals, c *client.Client, id string, argv []string, env map[string]string, o execOptions) error {
	req, err := o.request(argv, env)
	if err != nil {
		return err
	}
	job, err := c.StartJob(ctx, id, req)
	if err != nil {
		return err
	}
	if g.json {
		return g.printJSON(map[string]string{"job_id": job})
	}
	fmt.Fprintln(g.stdout, job)
	return nil
}

// execStream runs the command through the NDJSON exec stream.
func execStream(ctx context.Context, g *globals, c *client.Client, id string, argv []string, env map[string]string, o execOptions) error {
	req, err := o.request(argv, env)
	if err != nil {
		return err
	}
	if o.interactive {
		in, err := io.ReadAll(io.LimitReader(os.Stdin, maxStdin+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		switch {
		case len(in) > maxStdin:
			return usagef("exec -i: stdin exceeds %d bytes; upload it with cp instead", maxStdin)
		case !utf8.Valid(in):
			// The API carries stdin as a JSON string, which cannot hold
			// arbitrary bytes.
			return usagef("exec -i: stdin is not UTF-8 text; upload binary input with cp instead")
		}
		req.Stdin = string(in)
	}
	res, err := c.Exec(ctx, id, req, g.streamOutput())
	if err != nil {
		return err
	}
	return g.commandResult(res)
}

// streamOutput writes a command's output to our stdout and stderr as it
// comes; nil under --json, which prints the whole result at the end.
func (g *globals) streamOutput() client.OutputFunc {
	if g.json {
		return nil
	}
	return func(stream string, data []byte) {
		if stream == "stderr" {
			_, _ = g.stderr.Write(data)
		} else {
			_, _ = g.stdout.Write(data)
		}
	}
}

// commandResult prints a finished command's result under --json and exits
// with the command's own exit code.
func (g *globals) commandResult(res *client.ExecResult) error {
	if g.json {
		if err := g.printJSON(jsonResult(res)); err != nil {
			return err
		}
	}
	return &exitStatus{code: commandExitCode(res)}
}

// execJSON is exec --json's output: the result, with each stream that is
// not UTF-8 text base64-encoded (and its encoding field saying so), so
// binary output survives byte-exact (JSON strings cannot hold it).
type execJSON struct {
	*client.ExecResult
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	StdoutEncoding string `json:"stdout_encoding,omitempty"`
	StderrEncoding string `json:"stderr_encoding,omitempty"`
}

func jsonResult(res *client.ExecResult) execJSON {
	out := execJSON{ExecResult: res, Stdout: res.Stdout, Stderr: res.Stderr}
	if !utf8.ValidString(res.Stdout) {
		out.Stdout, out.StdoutEncoding = base64.StdEncoding.EncodeToString([]byte(res.Stdout)), "base64"
	}
	if !utf8.ValidString(res.Stderr) {
		out.Stderr, out.StderrEncoding = base64.StdEncoding.EncodeToString([]byte(res.Stderr)), "base64"
	}
	return out
}

// commandExitCode is the status sandboxctl exits with for a finished command:
// its own code, which the agent already reports as 128+N for signal N; an
// outcome the daemon lost (-1) is a plain failure.
func commandExitCode(res *client.ExecResult) int {
	if res.ExitCode < 0 || res.ExitCode > 255 {
		return exitFailed
	}
	return res.ExitCode
}

// execTTY runs the command on a pseudo-terminal over the terminal WebSocket,
// with the local terminal in raw mode for the duration.
func execTTY(ctx context.Context, g *globals, c *client.Client, id string, argv []string, env map[string]string, o execOptions) error {
	switch {
	case !o.interactive:
		return usagef("exec: -t needs -i")
	case o.timeout != 0:
		return usagef("exec: --timeout does not apply to -t sessions")
	case !term.IsTerminal(int(os.Stdin.Fd())):
		return usagef("exec -it: stdin is not a terminal")
	}
	req := client.TerminalRequest{Argv: argv, Env: env, Cwd: o.cwd}
	if cols, rows, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		req.Rows, req.Cols = uint16(rows), uint16(cols)
	}
	t, err := c.OpenTerminal(ctx, id, req)
	if err != nil {
		return err
	}
	defer t.Close()
	state, err := term.MakeRaw(int(os.Stdin.Fd()))
	if err != nil {
		return fmt.Errorf("raw terminal: %w", err)
	}
	// Restored before any message is printed, whatever happens next.
	restore := func() { _ = term.Restore(int(os.Stdin.Fd()), state) }
	defer restore()

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if cols, rows, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
				_ = t.Resize(uint16(rows), uint16(cols))
			}
		}
	}()
	// In raw mode Ctrl-C reaches the remote command as a byte; only a
	// signal from outside (SIGTERM) ends the session from here.
	go func() {
		<-ctx.Done()
		_ = t.Close()
	}()
	// The stdin copier may stay blocked in Read after the command ends; the
	// process exits right after, so it is not waited for.
	go func() { _, _ = io.Copy(t, os.Stdin) }()

	for chunk := range t.Output() {
		_, _ = g.stdout.Write(chunk)
	}
	res, err := t.Wait()
	restore()
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		return err
	}
	if g.json {
		if err := g.printJSON(jsonResult(res)); err != nil {
			return err
		}
	}
	return &exitStatus{code: commandExitCode(res)}
}
