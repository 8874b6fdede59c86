package main

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

func imagesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Language images and OCI images",
	}
	cmd.AddCommand(imagesLsCmd(g), imagesBuildCmd(g), imagesPullCmd(g), imagesImportCmd(g), imagesRmCmd(g), imagesPruneCmd(g))
	return cmd
}

func imagesLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
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
	}
}

// imagesBuildCmd builds language or VM guest images by name, or (-f) an
// image from a Dockerfile and a context directory.
func imagesBuildCmd(g *globals) *cobra.Command {
	var (
		vmGuest    bool
		dockerfile string
		dreq       apitypes.DockerfileBuildRequest
		buildArgs  []string
	)
	build := &cobra.Command{
		Use:   "build [--vm] LANG... | build -f Dockerfile [-t NAME] [--build-arg K=V] DIR",
		Short: "Build language images unless they are up to date (the log streams as it builds); --vm: VM guest images (linux, or a language); -f: an image from a Dockerfile and the context DIR",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if dockerfile != "" {
				if len(args) != 1 || vmGuest {
					return fmt.Errorf("build -f: one context directory, no --vm")
				}
				if dreq.BuildArgs, err = parseBuildArgs(buildArgs); err != nil {
					return err
				}
				return buildDockerfile(cmd.Context(), g, c, dockerfile, args[0], dreq)
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
	build.Flags().StringVarP(&dockerfile, "file", "f", "", "build from this Dockerfile with the context directory DIR")
	build.Flags().StringVarP(&dreq.Tag, "tag", "t", "", "with -f: name of the image (a plain name or registry/name:tag)")
	build.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "with -f: KEY=VALUE for an ARG (repeatable)")
	build.Flags().StringVar(&dreq.Network, "network", "", "with -f: network of the RUN steps: none, egress or allowlist (default: the daemon's)")
	build.Flags().StringArrayVar(&dreq.Allow, "allow", nil, "with -f and --network allowlist: a host the RUN steps may reach (repeatable)")
	build.Flags().BoolVar(&dreq.NoCache, "no-cache", false, "with -f: run every step again")
	return build
}

// parseBuildArgs turns --build-arg KEY=VALUE flags into a map (nil for
// none, as the request had without them).
func parseBuildArgs(kvs []string) (map[string]string, error) {
	var out map[string]string
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--build-arg %q: KEY=VALUE expected", kv)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out, nil
}

func imagesPullCmd(g *globals) *cobra.Command {
	return &cobra.Command{
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
	}
}

func imagesImportCmd(g *globals) *cobra.Command {
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
	return imp
}

func imagesRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
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
	}
}

func imagesPruneCmd(g *globals) *cobra.Command {
	return &cobra.Command{
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
	}
}

// buildDockerfile sends dir as the build context (a tar streamed as it is
// written) with the Dockerfile at path, inside dir or added to the
// context under a name of its own.
func buildDockerfile(ctx context.Context, g *globals, c *client.Client, path, dir string, req apitypes.DockerfileBuildRequest) error {
	df, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	absDF, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	extra := ""
	if rel, err := filepath.Rel(absDir, absDF); err == nil && !strings.HasPrefix(rel, "..") {
		req.DockerfilePath = filepath.ToSlash(rel)
	} else {
		extra = ".sandboxctl-Dockerfile"
		req.DockerfilePath = extra
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeContextTar(pw, absDir, extra, df)) }()
	defer pr.Close()
	img, err := c.BuildDockerfile(ctx, pr, req, func(p apitypes.BuildProgress) {
		switch p.Phase {
		case "step":
			how := ""
			if p.Cached {
				how = " (cached)"
			}
			fmt.Fprintf(g.stderr, "step %d/%d: %s%s\n", p.Step, p.Steps, p.Instruction, how)
		case "output":
			fmt.Fprint(g.stderr, p.Output)
		}
	})
	if err != nil {
		return fmt.Errorf("build %s: %w", dir, err)
	}
	return printPulled(g, img)
}

// writeContextTar writes dir as a tar: directories, regular files and
// symlinks (as links; the daemon refuses ones leading out), plus the
// Dockerfile under extra when it lives outside dir.
func writeContextTar(w io.Writer, dir, extra string, df []byte) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.IsDir() && !fi.Mode().IsRegular() {
			return nil // sockets, fifos, devices are no context
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if extra != "" {
		if err := tw.WriteHeader(&tar.Header{Name: extra, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(df))}); err != nil {
			return err
		}
		if _, err := tw.Write(df); err != nil {
			return err
		}
	}
	return tw.Close()
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
