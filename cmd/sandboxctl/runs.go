package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
)

// maxRunFile bounds one source file sent with `sandboxctl run`.
const maxRunFile = 32 << 20

// runCmd is the one-shot run_code: `sandboxctl run --lang L FILE...`. The
// first file is the entrypoint; files keep their base names in /workspace.
func runCmd(g *globals) *cobra.Command {
	var (
		lang, stdinFile string
		backend         string
		args            []string
		timeout         time.Duration
		noInstall       bool
	)
	cmd := &cobra.Command{
		Use:   "run --lang L FILE [FILE...]",
		Short: "Run code in a fresh sandbox (install, compile, run) and keep a run record",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			if lang == "" {
				return usagef("--lang is required")
			}
			progFiles, entry, err := readProgram(files)
			if err != nil {
				return err
			}
			req := client.RunCodeRequest{Language: lang, Files: progFiles, Entrypoint: entry, Args: args, Backend: backend}
			if stdinFile != "" {
				data, err := readLimited(stdinFile, maxRunFile)
				if err != nil {
					return usageErr(err)
				}
				req.Stdin = string(data)
			}
			if timeout > 0 {
				s := timeout.Seconds()
				req.TimeoutSeconds = &s
			}
			if noInstall {
				f := false
				req.Install = &f
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.RunCode(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(res); err != nil {
					return err
				}
			} else {
				for _, st := range res.Steps {
					if st.Name != "run" || st.ExitCode != 0 {
						fmt.Fprintf(g.stderr, "--- %s: exit %d (%s) in %dms\n", st.Name, st.ExitCode, st.Termination.Cause, st.DurationMS)
					}
					_, _ = io.WriteString(g.stdout, st.Stdout)
					_, _ = io.WriteString(g.stderr, st.Stderr)
				}
				fmt.Fprintf(g.stderr, "--- run %s\n", res.RunID)
			}
			if res.ExitCode != 0 {
				return &exitStatus{code: min(max(res.ExitCode, 1), 255)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&lang, "lang", "l", "", "language (sandboxctl languages)")
	cmd.Flags().StringArrayVarP(&args, "arg", "a", nil, "argument for the program (repeatable)")
	cmd.Flags().StringVar(&stdinFile, "stdin", "", "file whose content is the program's stdin")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "time limit of the whole run")
	cmd.Flags().BoolVar(&noInstall, "no-install", false, "do not install dependencies found in the files")
	cmd.Flags().StringVar(&backend, "backend", "", "container (default) or vm: run in a VM of the language's guest image")
	return cmd
}

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

// runsCmd lists and shows run records.
func runsCmd(g *globals) *cobra.Command {
	var (
		limit int
		lang  string
	)
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List run records, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Runs(cmd.Context(), client.RunFilter{Limit: limit, Language: lang})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(emptyIfNil(l))
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tLANGUAGE\tSUCCESS\tEXIT\tCAUSE\tDURATION\tSTARTED")
			for _, m := range l {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\t%dms\t%s\n", m.RunID, m.Language, m.Success, m.ExitCode,
					m.Termination.Cause, m.DurationMS, m.StartTime.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	ls.Flags().IntVar(&limit, "limit", 50, "how many")
	ls.Flags().StringVar(&lang, "lang", "", "only this language")
	show := &cobra.Command{
		Use:   "show RUN_ID",
		Short: "Show a run record: metadata, then the start of its logs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.Run(cmd.Context(), args[0], 0)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(r)
			}
			m := r.Metadata
			fmt.Fprintf(g.stdout, "run        %s (%s)\nlanguage   %s, image %s, sandbox %s\nstarted    %s, %dms\nresult     exit %d, %s, success %v\nrecord     %s\n",
				m.RunID, m.Kind, m.Language, m.Image, m.SandboxID, m.StartTime.Local().Format(time.DateTime), m.DurationMS,
				m.ExitCode, m.Termination.Cause, m.Success, r.Dir)
			for _, st := range m.Steps {
				fmt.Fprintf(g.stdout, "step       %-8s exit %d (%s) %dms\n", st.Name, st.ExitCode, st.Termination.Cause, st.DurationMS)
			}
			fmt.Fprintf(g.stdout, "--- stdout%s\n%s", truncMark(r.StdoutTruncated), r.Stdout)
			fmt.Fprintf(g.stdout, "--- stderr%s\n%s", truncMark(r.StderrTruncated), r.Stderr)
			return nil
		},
	}
	cmd := &cobra.Command{Use: "runs", Short: "Run records", Args: cobra.NoArgs, RunE: ls.RunE}
	cmd.Flags().AddFlagSet(ls.Flags())
	cmd.AddCommand(ls, show, runsExportCmd(g), runsReplayCmd(g))
	return cmd
}

func truncMark(t bool) string {
	if t {
		return " (truncated; the full log is in the record)"
	}
	return ""
}

// languagesCmd lists the languages and whether their images are built.
func languagesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "languages",
		Short: "List languages, their versions and whether their images are built",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Languages(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(emptyIfNil(l))
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LANGUAGE\tVERSION\tIMAGE READY\tEXTENSIONS\tTASKS")
			for _, li := range l {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%v\t%v\n", li.Name, li.Version, li.ImageReady, li.Extensions, li.Tasks)
			}
			return tw.Flush()
		},
	}
}

// readProgram reads the FILE arguments of run and autofix: each becomes a
// file of /workspace under its base name, the first is the entrypoint.
func readProgram(paths []string) (map[string]string, string, error) {
	files, entry := map[string]string{}, ""
	for i, f := range paths {
		data, err := readLimited(f, maxRunFile)
		if err != nil {
			return nil, "", usageErr(err)
		}
		name := filepath.Base(f)
		if _, dup := files[name]; dup {
			return nil, "", usagef("two files named %s", name)
		}
		files[name] = string(data)
		if i == 0 {
			entry = name
		}
	}
	return files, entry, nil
}
