package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

func imagesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Language images and OCI images",
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the built images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			imgs, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(imgs)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tBUILT\tSUITE\tPACKAGES\tUSERS")
			for _, im := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", im.Name, shortDigest(im.Digest), humanBytes(im.SizeBytes),
					ago(now, im.BuiltAt), im.Suite, im.Packages, len(im.Users))
			}
			return tw.Flush()
		},
	})
	var vmGuest bool
	build := &cobra.Command{
		Use:   "build [--vm] LANG...",
		Short: "Build language images unless they are up to date (the log streams as it builds); --vm: VM guest images (linux, or a language)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			do := c.BuildImage
			if vmGuest {
				do = c.BuildVMImage
			}
			for _, name := range args {
				img, err := do(cmd.Context(), name, func(line string) { fmt.Fprintln(g.stderr, line) })
				if err != nil {
					return fmt.Errorf("build %s: %w", name, err)
				}
				fmt.Fprintf(g.stdout, "%s\t%s\n", img.Name, shortDigest(img.Digest))
			}
			return nil
		},
	}
	build.Flags().BoolVar(&vmGuest, "vm", false, "build VM guest images: linux (the Linux test guest) or a language made into a guest")
	cmd.AddCommand(build)
	cmd.AddCommand(&cobra.Command{
		Use:   "pull REFERENCE",
		Short: "Pull an OCI image from a registry (registry[:port]/name:tag or @sha256:digest); progress on stderr",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			img, err := c.PullImage(cmd.Context(), args[0], func(p apitypes.ImageProgress) { printImageProgress(g, p) })
			if err != nil {
				return fmt.Errorf("pull %s: %w", args[0], err)
			}
			return printPulled(g, img)
		},
	})
	var importRef string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import the image of a docker save archive or a tar of an OCI layout (- reads standard input)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var in io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				if fi, err := f.Stat(); err == nil && fi.IsDir() {
					return fmt.Errorf("import %s: a directory; send an OCI layout as a tar (tar -C DIR -cf - .)", args[0])
				}
				in = f
			}
			img, err := c.ImportImage(cmd.Context(), in, importRef, func(p apitypes.ImageProgress) { printImageProgress(g, p) })
			if err != nil {
				return fmt.Errorf("import %s: %w", args[0], err)
			}
			return printPulled(g, img)
		},
	}
	imp.Flags().StringVar(&importRef, "reference", "", "the image to take from an archive holding several (its tag)")
	cmd.AddCommand(imp)
	cmd.AddCommand(&cobra.Command{
		Use:   "rm LANG...",
		Short: "Remove language images (refused while a sandbox uses one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.RemoveImage(cmd.Context(), name); err != nil {
					return fmt.Errorf("rm %s: %w", name, err)
				}
				fmt.Fprintln(g.stdout, name)
			}
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "prune",
		Short: "Remove stale images (an older digest of a recipe) that no sandbox uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			removed, err := c.PruneImages(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(removed)
			}
			for _, im := range removed {
				fmt.Fprintf(g.stdout, "%s\t%s\t%s\n", im.Name, shortDigest(im.Digest), humanBytes(im.SizeBytes))
			}
			return nil
		},
	})
	return cmd
}

func printImageProgress(g *globals, p apitypes.ImageProgress) {
	switch p.Phase {
	case "resolved":
		fmt.Fprintf(g.stderr, "%s: %d layers\n", p.Digest, p.Layers)
	case "layer":
		how := "pulled"
		if p.Cached {
			how = "stored already"
		}
		fmt.Fprintf(g.stderr, "layer %d/%d %s: %s, %s\n", p.Index+1, p.Layers, shortDigest(p.Layer), humanBytes(p.Bytes), how)
	}
}

func printPulled(g *globals, img *apitypes.Image) error {
	if g.json {
		return g.printJSON(img)
	}
	fmt.Fprintf(g.stdout, "%s\t%s\t%s\n", img.Name, shortDigest(img.Digest), humanBytes(img.SizeBytes))
	return nil
}

// shortDigest shortens "sha256:abcdef..." to 12 hex digits, like docker.
func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

func gcCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Reclaim orphaned containers, cgroups, mounts and state directories",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.GC(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				err = g.printJSON(rep)
			} else {
				for _, r := range rep.Removed {
					fmt.Fprintln(g.stdout, "removed", r)
				}
				fmt.Fprintf(g.stdout, "%d removed, %d errors\n", len(rep.Removed), len(rep.Errors))
				for _, e := range rep.Errors {
					fmt.Fprintln(g.stderr, "error:", e)
				}
			}
			if err == nil && len(rep.Errors) > 0 {
				return &exitStatus{code: exitFailed}
			}
			return err
		},
	}
}
