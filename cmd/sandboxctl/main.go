// Command sandboxctl administers a running mcp-sandboxd over its REST API:
// sandboxes, commands, files, images and the daemon's health (docs/SPEC.md
// "sandboxctl"). It reaches the daemon through its unix socket (--socket,
// SANDBOXD_SOCKET) or over HTTP (--url with --token or SANDBOXD_TOKEN).
//
// Exit codes: 0 ok; 1 the operation failed; 2 usage or invalid argument;
// 3 not found; 4 daemon unreachable; 5 unhealthy. exec exits with the
// sandboxed command's own exit code.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Exit codes (docs/SPEC.md).
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitUnreachable = 4
	exitUnhealthy   = 5
)

func main() {
	if askpass(os.Stdout) {
		// Run by ssh as SSH_ASKPASS for sandboxctl ssh: print the token.
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one sandboxctl command line and returns its exit code.
func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	root, g := newRoot(stdout, stderr)
	root.SetArgs(argv)
	err := root.ExecuteContext(ctx)
	if err != nil && !g.started {
		// Cobra failed before any command ran: unknown command or flag,
		// wrong number of arguments.
		err = usageErr(err)
	}
	var st *exitStatus
	if err != nil && !errors.As(err, &st) {
		fmt.Fprintln(stderr, "sandboxctl:", err)
	}
	return exitCode(err)
}

// globals are the flags every command shares.
type globals struct {
	socket string
	url    string
	token  string
	json   bool
	// started is set once a command's own code runs; errors before that
	// are cobra's, about the command line.
	started bool
	stdout  io.Writer
	stderr  io.Writer
}

func newRoot(stdout, stderr io.Writer) (*cobra.Command, *globals) {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "sandboxctl",
		Short:         "Administer mcp-sandboxd: sandboxes, commands, files, images, health",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(*cobra.Command, []string) {
			g.started = true
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.socket, "socket", envOr("SANDBOXD_SOCKET", client.DefaultSocket), "daemon API socket (env SANDBOXD_SOCKET)")
	pf.StringVar(&g.url, "url", "", "daemon HTTP address instead of the socket, e.g. http://127.0.0.1:7070")
	pf.StringVar(&g.token, "token", os.Getenv("SANDBOXD_TOKEN"), "bearer token for --url (env SANDBOXD_TOKEN)")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.AddCommand(
		statusCmd(g), healthCmd(g),
		psCmd(g), inspectCmd(g), createCmd(g), rmCmd(g), pauseCmd(g), resumeCmd(g),
		execCmd(g), cpCmd(g), exportCmd(g), jobsCmd(g), logsCmd(g), killCmd(g),
		runCmd(g), runsCmd(g), languagesCmd(g), autofixCmd(g), agentCmd(g),
		imagesCmd(g), gcCmd(g), uiCmd(g), networkCmd(g), portCmd(g), screenshotCmd(g), vmTestCmd(g),
		snapshotCmd(g), snapshotsCmd(g), restoreCmd(g), keysCmd(g), auditCmd(g), webhooksCmd(g),
		sshCmd(g), sshKeysCmd(g), sshConfigCmd(g), sshProxyCmd(g), volumesCmd(g), templatesCmd(g), nodesCmd(g),
	)
	return root, g
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// client connects to the daemon the flags name.
func (g *globals) client() (*client.Client, error) {
	c, err := client.New(client.Options{Socket: g.socket, URL: g.url, Token: g.token})
	if err != nil {
		return nil, usageErr(err)
	}
	return c, nil
}

// printJSON writes v indented, for --json.
// eachName runs op on every name a command was given (rm of volumes,
// templates, snapshots): each name done is printed, each failure reported
// with its name, and the first failure is the command's error, so one bad
// name does not stop the others.
func (g *globals) eachName(names []string, op func(name string) error) error {
	var first error
	for _, name := range names {
		if err := op(name); err != nil {
			fmt.Fprintf(g.stderr, "%s: %v\n", name, err)
			if first == nil {
				first = err
			}
			continue
		}
		fmt.Fprintln(g.stdout, name)
	}
	return first
}

func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// usageError is a mistake on the command line (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErr(err error) error { return &usageError{err: err} }

func usagef(format string, args ...any) error { return usageErr(fmt.Errorf(format, args...)) }

// exitStatus ends the program with a status and no message of its own (exec
// exiting with the command's code, health reporting "unhealthy").
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// exitCode maps an error to the process exit code (docs/SPEC.md).
func exitCode(err error) int {
	var (
		st    *exitStatus
		usage *usageError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &st):
		return st.code
	case errors.Is(err, client.ErrUnreachable):
		return exitUnreachable
	case errors.As(err, &usage):
		return exitUsage
	}
	var e *errdefs.Error
	if errors.As(err, &e) {
		switch e.Code {
		case errdefs.InvalidArgument:
			return exitUsage
		case errdefs.NotFound:
			return exitNotFound
		}
	}
	return exitFailed
}
