package main

import (
	"fmt"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// imagesCmd builds and lists language images without a running daemon, for
// provisioning (and `make run`). The image store serialises concurrent builds
// of one recipe itself, so no daemon lock is needed.
func imagesCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{Use: "images", Short: "Build or list language images offline"}
	cmd.PersistentFlags().StringVar(&cfgPath, "config", config.DefaultPath, "configuration file")
	open := func() (*config.Config, *image.Store, error) {
		cfg, err := loadConfig(cfgPath)
		if err != nil {
			return nil, nil, &exitError{code: 2, err: err}
		}
		dir := cfg.Paths.ImagesDir
		if dir == "" {
			dir = filepath.Join(cfg.Paths.StateDir, "images")
		}
		st, err := image.OpenStore(dir)
		return cfg, st, err
	}
	build := &cobra.Command{
		Use:   "build NAME...",
		Short: "Build the images of the named recipes unless they are up to date",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, st, err := open()
			if err != nil {
				return err
			}
			recipes, err := image.LoadRecipes(cfg.Paths.RecipesDir)
			if err != nil {
				return err
			}
			b := &image.Builder{Store: st, Mirror: cfg.Images.Mirror, Suite: cfg.Images.Suite, Log: cmd.ErrOrStderr()}
			for _, name := range args {
				r, ok := recipes[name]
				if !ok {
					return &exitError{code: 2, err: fmt.Errorf("no recipe %q in %s", name, cfg.Paths.RecipesDir)}
				}
				start := time.Now()
				img, err := b.Ensure(cmd.Context(), r)
				if err != nil {
					return fmt.Errorf("build %s: %w", name, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", img.Name, img.Digest[:12], time.Since(start).Round(time.Millisecond))
			}
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List built images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, st, err := open()
			if err != nil {
				return err
			}
			imgs, err := st.List()
			if err != nil {
				return err
			}
			sort.Slice(imgs, func(i, j int) bool { return imgs[i].Name < imgs[j].Name })
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tBUILT")
			for _, i := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%dM\t%s\n", i.Name, i.Digest[:12], i.SizeBytes>>20, i.BuiltAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(build, ls)
	return cmd
}
