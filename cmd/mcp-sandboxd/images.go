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
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// imagesCmd builds and lists language images without a running daemon, for
// provisioning (and `make run`). The image store serialises concurrent builds
// of one recipe itself, so no daemon lock is needed.
func imagesCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{Use: "images", Short: "Build or list language images offline"}
	cmd.PersistentFlags().StringVar(&cfgPath, "config", config.DefaultPath, "configuration file")
	cmd.AddCommand(imagesBuildCmd(&cfgPath), imagesLsCmd(&cfgPath))
	return cmd
}

// imagesBuildCmd is the build subcommand of imagesCmd.
func imagesBuildCmd(cfgPath *string) *cobra.Command {
	var vmGuest bool
	build := &cobra.Command{
		Use:   "build [--vm] NAME...",
		Short: "Build the images of the named recipes unless they are up to date (--vm: VM guest images, linux or a language)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, st, err := openImageStore(*cfgPath)
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
				if vmGuest {
					if r, err = vm.GuestRecipe(cfg.Paths.RecipesDir, name, r); err != nil {
						return &exitError{code: 2, err: err}
					}
				} else if !ok {
					return &exitError{code: 2, err: fmt.Errorf("no recipe %q in %s", name, cfg.Paths.RecipesDir)}
				}
				start := time.Now()
				img, err := b.Ensure(cmd.Context(), r)
				if err != nil {
					return fmt.Errorf("build %s: %w", name, err)
				}
				if vmGuest {
					// The bootable guest (kernel, initramfs with this
					// daemon's agent, qcow2 disk) where the daemon looks.
					if _, err := vm.PrepareGuest(cmd.Context(), img, cfg.Paths.AgentPath, filepath.Join(imagesStoreDir(cfg), "vm-guests")); err != nil {
						return fmt.Errorf("make guest of %s: %w", img.Name, err)
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", img.Name, img.Digest[:12], time.Since(start).Round(time.Millisecond))
			}
			return nil
		},
	}
	build.Flags().BoolVar(&vmGuest, "vm", false, "build VM guest images: linux (the Linux test guest) or a language made into a guest")
	return build
}

// imagesLsCmd is the ls subcommand of imagesCmd.
func imagesLsCmd(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List built images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, st, err := openImageStore(*cfgPath)
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
}

// imagesStoreDir is where the daemon of cfg keeps its images.
func imagesStoreDir(cfg *config.Config) string {
	if cfg.Paths.ImagesDir != "" {
		return cfg.Paths.ImagesDir
	}
	return filepath.Join(cfg.Paths.StateDir, "images")
}

// openImageStore loads the configuration at cfgPath and opens its image
// store.
func openImageStore(cfgPath string) (*config.Config, *image.Store, error) {
	cfg, err := loadConfig(cfgPath)
	if err != nil {
		return nil, nil, &exitError{code: 2, err: err}
	}
	st, err := image.OpenStore(imagesStoreDir(cfg))
	return cfg, st, err
}
