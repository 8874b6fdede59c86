package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// jobsCmd lists a sandbox's commands (foreground ones that were interrupted,
// background ones, and those that finished while the daemon was down).
func jobsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "jobs ID",
		Short: "List the commands of a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			jobs, err := c.Jobs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(emptyIfNil(jobs))
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB\tSTATE\tEXIT\tSTARTED\tCOMMAND")
			for _, j := range jobs {
				exit := "-"
				if j.Exit != nil {
					exit = fmt.Sprintf("%d (%s)", j.Exit.ExitCode, j.Exit.Cause)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", j.ID, j.State, exit,
					j.StartedAt.Local().Format(time.DateTime), strings.Join(j.Argv, " "))
			}
			return tw.Flush()
		},
	}
}

// emptyIfNil makes an empty list print as [] rather than null in --json.
func emptyIfNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// logsCmd prints a job's output (stdout to stdout, stderr to stderr); with
// --follow it waits for the job to finish and exits with its code.
func logsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs [-f] ID JOB",
		Short: "Print the output of a sandbox command",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var outOff, errOff int64
			for {
				st, err := c.JobStatus(cmd.Context(), args[0], args[1], outOff, errOff, 1<<20)
				if err != nil {
					return err
				}
				_, _ = io.WriteString(g.stdout, st.Stdout)
				_, _ = io.WriteString(g.stderr, st.Stderr)
				progressed := st.NextStdoutOffset != outOff || st.NextStderrOffset != errOff
				outOff, errOff = st.NextStdoutOffset, st.NextStderrOffset
				if progressed {
					continue // drain what is there before deciding anything
				}
				if st.State == "finished" {
					if follow && st.ExitCode != nil && *st.ExitCode != 0 {
						return &exitStatus{code: *st.ExitCode}
					}
					return nil
				}
				if !follow {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(200 * time.Millisecond):
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "wait for the job to finish, streaming its output")
	return cmd
}

// killCmd signals a job's process group (default SIGKILL).
func killCmd(g *globals) *cobra.Command {
	var signal string
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] ID JOB",
		Short: "Send a signal to a sandbox command's process group (default SIGKILL)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.KillJob(cmd.Context(), args[0], args[1], signal)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintln(g.stdout, args[1])
			return nil
		},
	}
	cmd.Flags().StringVarP(&signal, "signal", "s", "", "signal name, e.g. SIGTERM (default SIGKILL)")
	return cmd
}
