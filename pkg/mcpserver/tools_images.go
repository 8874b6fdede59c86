package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// The images tool group: the language and VM guest images through the
// engine's image operations, as REST /v1/images and `sandboxctl images`
// use them.

type imageListIn struct{}

type imageListOut = apitypes.ImageList

func imageText(im *apitypes.Image) string {
	s := fmt.Sprintf("%s: digest %s, %d MiB, built %s", im.Name, shortDigest(im.Digest), im.SizeBytes>>20, im.BuiltAt.UTC().Format("2006-01-02T15:04:05Z"))
	if im.Recipe != "" {
		kind := "recipe " + im.Recipe
		if im.VM {
			kind = "VM guest of " + im.Recipe
		}
		s += ", " + kind
	}
	if im.UpToDate != nil {
		if *im.UpToDate {
			s += ", up to date"
		} else {
			s += ", out of date (image_build rebuilds it)"
		}
	}
	return s + fmt.Sprintf(", in use by %d sandboxes", im.InUse)
}

func orNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

func shortDigest(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

// progressWriter hands what an image build logs to the call's progress
// notifier (nil without a progress token), which sends it as progress
// notifications, coalesced like command output.
type progressWriter struct{ out func(string, []byte) }

func (w progressWriter) Write(p []byte) (int, error) {
	if w.out != nil {
		w.out("stdout", p)
	}
	return len(p), nil
}

func (s *srv) addImageTools() {
	addTool[imageListIn, imageListOut](s, "image_list", "List images",
		joinLines(
			"List the built images — name, recipe (what image_build takes; vm true for a VM guest image vm-NAME), size, built_at, digest, in_use (live sandboxes on it; users lists them), up_to_date (built from the recipe as it is now) — and the recipes not built yet (unbuilt: what image_build can make).",
			"A language image that is not built is also built on first use by sandbox_create/run_code when images.build_on_demand is on.",
		),
		annotations{readOnly: true, idempotent: true},
		s.imageList)

	addTool[apitypes.ImageBuildRequest, apitypes.Image](s, "image_build", "Build an image",
		joinLines(
			"Build the image of a recipe unless it is up to date, and return it (name, digest, size, built_at, recipe, up_to_date). An up-to-date image returns at once; otherwise the build (Debian packages with mmdebstrap) takes from tens of seconds to several minutes, and the image becomes current for new sandboxes while running sandboxes keep the one they started on.",
			"name: a recipe from image_list (a language or another recipe such as agent); with vm: true, a VM guest image (vm-NAME for sandbox_create {backend: vm} and vm_test) of linux or a language.",
			"With a progress token, the build log is sent as progress notifications while it builds; without one the call stays silent but heartbeats keep it alive. Cancelling the call stops the build, and so does a client giving up at its tool timeout (Claude Code: MCP_TOOL_TIMEOUT, raise it for builds) — or build ahead with `sandboxctl images build NAME`.",
		),
		annotations{idempotent: true},
		s.imageBuild)

	addTool[apitypes.ImagePullRequest, apitypes.Image](s, "image_pull", "Pull an OCI image",
		joinLines(
			"Pull an OCI image from a registry (reference: registry[:port]/name:tag or ...@sha256:digest; an index resolves to linux/amd64) into the image store, and return it: name (oci-<12 hex of its config digest>, what sandbox_create takes, as does the reference itself), digest, size and oci (references, layers, working_dir, user, entrypoint, cmd).",
			"Credentials and CAs come from the daemon's configuration (images.registries, images.docker_config). A non-admin key pulls only from registries at public addresses (redirects included), unless images.private_registries or images.registries names the registry: anything else is permission_denied naming the address. Every blob is checked against its digest; layers already stored are not fetched again. An image with an entry that could reach outside its tree, a device, a setuid file owned outside the sandbox's ids, or more than images.max_size unpacked is refused, naming the layer and the entry.",
			"With a progress token, each layer is reported as a progress notification as it is unpacked. The image's Entrypoint/Cmd are recorded, never run: sandboxes from it start with the daemon's own init and agent, and commands run as the image's user in its working directory with its Env.",
		),
		annotations{idempotent: true},
		s.imagePull)

	addTool[apitypes.DockerfileBuildRequest, apitypes.Image](s, "image_build_dockerfile", "Build an image from a Dockerfile",
		joinLines(
			"Build an image from a Dockerfile (dockerfile: its text) with the build context given inline (files: relative path → text content, for COPY and ADD), and return it; sandbox_create {image: tag} and template_create take it.",
			"FROM names a pulled image (a reference) or a language image (its user is the sandbox user: write USER root before RUN steps that need root). RUN runs in a root-mode sandbox under the build's network (none, egress or allowlist with allow; default the server's). COPY and ADD take context files only (no URLs, no archive unpacking). ENV, ARG (build_args), WORKDIR, USER, LABEL, ENTRYPOINT, CMD, EXPOSE and SHELL set the image's configuration. Refused: VOLUME, HEALTHCHECK, ONBUILD, STOPSIGNAL, RUN --mount and other RUN options, COPY --from, multi-stage builds.",
			"Each step is a cached layer: a rebuild of an unchanged Dockerfile and context runs no step, and a change in a late step reuses every earlier layer (no_cache: true runs them all). Errors name the Dockerfile line. With a progress token, steps and RUN output are sent as progress notifications.",
		),
		annotations{idempotent: true},
		s.imageBuildDockerfile)

	addTool[apitypes.ImageDeleteRequest, apitypes.ImageDeleteResult](s, "image_delete", "Delete an image",
		joinLines(
			"Delete a built image (every tree built for that name) from the image store. Refused with conflict while a live sandbox runs on it: terminate those first (image_list: users).",
			"A deleted language image is built again on the next sandbox_create/run_code of that language (minutes) when images.build_on_demand is on, or by image_build.",
		),
		annotations{destructive: true},
		s.imageDelete)
}

// imageBuild is image_build: a recipe's image (a VM guest's with vm),
// the build log as progress.
func (s *srv) imageBuild(ctx context.Context, c *call, in *apitypes.ImageBuildRequest) (*result, error) {
	// The result does not carry the log: its last lines are sent too.
	c.progress.sendRestAtStop()
	build := s.e.EnsureImage
	if in.VM {
		build = s.e.EnsureVMImage
	}
	img, err := build(ctx, in.Name, progressWriter{c.progress.outputFunc()})
	if err != nil {
		return nil, err
	}
	return &result{structured: img, text: "image " + imageText(img)}, nil
}

// imagePull is image_pull: each layer as a progress line.
func (s *srv) imagePull(ctx context.Context, c *call, in *apitypes.ImagePullRequest) (*result, error) {
	out := c.progress.outputFunc()
	img, err := s.e.PullImage(ctx, in.Reference, func(p apitypes.ImageProgress) {
		if out == nil {
			return
		}
		switch p.Phase {
		case "resolved":
			out("stderr", []byte(fmt.Sprintf("image %s (%s): %d layers\n", p.Image, p.Digest, p.Layers)))
		case "layer":
			how := "pulled"
			if p.Cached {
				how = "stored already"
			}
			out("stderr", []byte(fmt.Sprintf("layer %d/%d %s: %d bytes, %s\n", p.Index+1, p.Layers, p.Layer, p.Bytes, how)))
		}
	})
	if err != nil {
		return nil, err
	}
	return &result{structured: img, text: "image " + imageText(img)}, nil
}

// imageBuildDockerfile is image_build_dockerfile: each step and the RUN
// steps' output as progress.
func (s *srv) imageBuildDockerfile(ctx context.Context, c *call, in *apitypes.DockerfileBuildRequest) (*result, error) {
	c.progress.sendRestAtStop()
	out := c.progress.outputFunc()
	img, err := s.e.BuildDockerfile(ctx, *in, nil, func(p apitypes.BuildProgress) {
		if out == nil {
			return
		}
		switch p.Phase {
		case "step":
			how := ""
			if p.Cached {
				how = " (cached)"
			}
			out("stderr", []byte(fmt.Sprintf("step %d/%d: %s%s\n", p.Step, p.Steps, p.Instruction, how)))
		case "output":
			out(p.Stream, []byte(p.Output))
		}
	})
	if err != nil {
		return nil, err
	}
	return &result{structured: img, text: "image " + imageText(img)}, nil
}

// imageDelete is image_delete.
func (s *srv) imageDelete(ctx context.Context, c *call, in *apitypes.ImageDeleteRequest) (*result, error) {
	if err := s.e.RemoveImage(ctx, in.Name); err != nil {
		return nil, err
	}
	return &result{structured: apitypes.ImageDeleteResult{Name: in.Name, Deleted: true}, text: "image " + in.Name + " deleted"}, nil
}

// imageList is image_list: the images and recipes, users lists cut to fit
// the result.
func (s *srv) imageList(ctx context.Context, c *call, in *imageListIn) (*result, error) {
	l, err := s.e.ImageList(ctx)
	if err != nil {
		return nil, err
	}
	return s.fit(func(limit int) *result {
		out := imageListOut{Unbuilt: l.Unbuilt, Images: make([]apitypes.Image, len(l.Images))}
		// Only users lists can grow (up to server limits):
		// they share what the budget leaves.
		per := max(limit/(24*len(l.Images)+1), 1)
		var names, stale, used, unbuilt []string
		for i, im := range l.Images {
			if len(im.Users) > per {
				im.Users = im.Users[:per]
				out.Note = "users lists cut to fit the result (in_use has the counts); sandbox_list shows every sandbox"
			}
			out.Images[i] = im
			names = append(names, im.Name)
			if im.UpToDate != nil && !*im.UpToDate {
				stale = append(stale, im.Name)
			}
			if im.InUse > 0 {
				used = append(used, fmt.Sprintf("%s (%d)", im.Name, im.InUse))
			}
		}
		for _, r := range l.Unbuilt {
			if r.VM {
				unbuilt = append(unbuilt, r.Name+" (vm)")
			} else {
				unbuilt = append(unbuilt, r.Name)
			}
		}
		// A summary: the structured content carries the list.
		text := fmt.Sprintf("%d images built: %s\nout of date: %s\nin use: %s\nnot built: %s",
			len(names), orNone(names), orNone(stale), orNone(used), orNone(unbuilt))
		return &result{structured: out, text: text}
	}), nil
}
