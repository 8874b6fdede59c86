package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// exportCmd is files_export: it packs a sandbox directory into an artifact
// kept by the daemon and downloads it, checking its sha256.
func exportCmd(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export ID [DIR] [-o FILE]",
		Short: "Export a sandbox directory (default /workspace) as a tar.gz",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			dir := ""
			if len(args) == 2 {
				dir = args[1]
			}
			art, err := c.ExportFiles(cmd.Context(), args[0], dir)
			if err != nil {
				return err
			}
			if out == "" {
				out = art.ID + ".tar.gz"
			}
			f, err := os.Create(out)
			if err != nil {
				return usageErr(err)
			}
			h := sha256.New()
			_, err = c.DownloadArtifact(cmd.Context(), art.ID, io.MultiWriter(f, h))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(out)
				return err
			}
			if sum := hex.EncodeToString(h.Sum(nil)); sum != art.SHA256 {
				os.Remove(out)
				return fmt.Errorf("artifact %s: downloaded sha256 %s, daemon says %s", art.ID, sum, art.SHA256)
			}
			if g.json {
				return g.printJSON(art)
			}
			fmt.Fprintf(g.stdout, "%s\t%s\t%d bytes\tsha256 %s\n", art.ID, out, art.Size, art.SHA256)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (default ARTIFACT_ID.tar.gz)")
	return cmd
}
