package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
)

// auditCmd is `sandboxctl audit`: verify and export the audit log, through
// the daemon or, with --dir, from a copy of its files.
func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Verify and export the tamper-evident audit log"}
	cmd.AddCommand(auditVerifyCmd(g), auditExportCmd(g))
	return cmd
}

func auditVerifyCmd(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "verify [--dir DIR]",
		Short: "Check the audit log's hash chain and checkpoints; name the first record edited, removed, inserted or reordered",
		Long: "Without --dir the daemon checks its live log and the checkpoints in its state database. " +
			"With --dir the files of DIR (a copy, or a stopped daemon's audit directory) are checked here, by their chain alone.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				rep *apitypes.AuditReport
				err error
			)
			if dir != "" {
				rep, err = audit.VerifyDir(dir, nil)
			} else {
				c, cerr := g.client()
				if cerr != nil {
					return cerr
				}
				rep, err = c.AuditVerify(cmd.Context())
			}
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(rep); err != nil {
					return err
				}
			} else {
				printAuditReport(g, rep)
			}
			if !rep.OK {
				return &exitStatus{code: exitFailed}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "verify the log files in DIR here instead of asking the daemon")
	return cmd
}

func printAuditReport(g *globals, rep *apitypes.AuditReport) {
	torn := ""
	if rep.TornTail {
		torn = " (a torn last line, never acknowledged, was ignored)"
	}
	if rep.OK {
		fmt.Fprintf(g.stdout, "OK: %d records (%d to %d) in %d files, %d checkpoints agree%s\nlast hash %s\n",
			rep.Records, rep.FirstSeq, rep.LastSeq, rep.Files, rep.Checkpoints, torn, rep.LastHash)
		return
	}
	p := rep.Problem
	fmt.Fprintf(g.stdout, "FAILED: record %d %s: %s\n%d records verified before it%s\n", p.Seq, p.Kind, p.Message, rep.Records, torn)
}

func auditExportCmd(g *globals) *cobra.Command {
	var dir, since string
	cmd := &cobra.Command{
		Use:   "export [--since TIME|DURATION] [--dir DIR]",
		Short: "Write the audit records as JSON lines of OCSF API Activity (class_uid 6003)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir != "" {
				t, err := audit.ParseSince(since, time.Now())
				if err != nil {
					return usageErr(err)
				}
				_, err = audit.ExportDir(cmd.Context(), dir, t, g.stdout)
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.AuditExport(cmd.Context(), since, g.stdout)
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "records from this RFC 3339 time, or this long ago (24h); default: all")
	cmd.Flags().StringVar(&dir, "dir", "", "export the log files in DIR here instead of asking the daemon")
	return cmd
}
