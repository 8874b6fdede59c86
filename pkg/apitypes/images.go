package apitypes

// Image types: image_list, image_build and image_delete, and the REST
// /v1/images endpoints they share with sandboxctl images.

// ImageList is the answer of image_list and GET /v1/images: the built
// images and the recipes that have no built image yet.
type ImageList struct {
	Images  []Image       `json:"images"`
	Unbuilt []ImageRecipe `json:"unbuilt"`
	// Note says that lists of users were cut to fit a tool result (MCP
	// only).
	Note string `json:"note,omitempty"`
}

// ImageRecipe is a recipe without a built image: what image_build can make.
type ImageRecipe struct {
	// Name is what image_build takes (with VM: a guest image vm-Name).
	Name string `json:"name"`
	VM   bool   `json:"vm,omitempty"`
	// Language: an enabled language (sandbox_create, run_code); false for
	// other recipes (e.g. agent) and disabled languages.
	Language    bool   `json:"language"`
	Description string `json:"description,omitempty"`
}

// ImageBuildRequest is the input of image_build (REST: POST
// /v1/images/{name}/build, ?vm=true).
type ImageBuildRequest struct {
	Name string `json:"name" jsonschema_description:"Recipe to build: a language (python, c, ...) or another recipe from image_list (built images' recipe, or unbuilt). With vm: linux or a language."`
	VM   bool   `json:"vm,omitempty" jsonschema_description:"Build a VM guest image (vm-NAME, for sandbox_create {backend: vm} and vm_test) instead of a container image: name is linux (the Linux test guest) or a language."`
}

// ImageDeleteRequest is the input of image_delete (REST: DELETE
// /v1/images/{name}).
type ImageDeleteRequest struct {
	Name string `json:"name" jsonschema_description:"Name of a built image, as image_list shows it (a language, or vm-NAME for a VM guest image)."`
}

// ImageDeleteResult is the outcome of image_delete.
type ImageDeleteResult struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// DockerfileBuildRequest builds an image from a Dockerfile
// (image_build_dockerfile, POST /v1/images/build, sandboxctl images build).
// The build context comes as an upload (REST) or as Files (MCP).
type DockerfileBuildRequest struct {
	Dockerfile string `json:"dockerfile" jsonschema_description:"The Dockerfile's text. FROM a pulled image or a language image; RUN, COPY, ADD (context files only), ENV, ARG, WORKDIR, USER, LABEL, ENTRYPOINT, CMD, EXPOSE, SHELL."`
	// Tag names the result: an image name (sandbox_create {image: tag})
	// or a registry reference.
	Tag       string            `json:"tag,omitempty" jsonschema_description:"Name of the image: a plain name (a-z, 0-9, _ and -) or a reference registry/name:tag. Default: oci-<digest prefix>."`
	BuildArgs map[string]string `json:"build_args,omitempty" jsonschema_description:"Values of the Dockerfile's ARGs."`
	// Files are the build context's files (MCP): path → content.
	Files map[string]string `json:"files,omitempty" jsonschema_description:"Build context: relative path to file content (text), for COPY and ADD."`
	// Network is the policy RUN steps run under ("": the daemon's
	// default); Allow its allowlist.
	Network string   `json:"network,omitempty" jsonschema_description:"Network of the RUN steps: none, egress or allowlist (default: the server's default)." jsonschema:"enum=none,enum=egress,enum=allowlist"`
	Allow   []string `json:"allow,omitempty" jsonschema_description:"With network allowlist: hosts the RUN steps may reach (e.g. the package mirror)."`
	NoCache bool     `json:"no_cache,omitempty" jsonschema_description:"Run every step again instead of reusing cached layers."`
	// DockerfilePath (REST) is the Dockerfile's path in the uploaded
	// context, read when Dockerfile is empty.
	DockerfilePath string `json:"-"`
}

// BuildProgress is one event of a Dockerfile build: "step" (an
// instruction done; Cached when its layer came from the build cache),
// "output" (a RUN step's output), "done" (Image is ready).
type BuildProgress struct {
	Phase       string  `json:"phase"`
	Step        int     `json:"step,omitempty"`
	Steps       int     `json:"steps,omitempty"`
	Instruction string  `json:"instruction,omitempty"`
	Cached      bool    `json:"cached,omitempty"`
	Layer       string  `json:"layer,omitempty"`
	Seconds     float64 `json:"seconds,omitempty"`
	Stream      string  `json:"stream,omitempty"`
	Output      string  `json:"output,omitempty"`
	Image       string  `json:"image,omitempty"`
	Digest      string  `json:"digest,omitempty"`
}

// DockerfileBuildLine is one line of a Dockerfile build's NDJSON stream
// (POST /v1/images/dockerfile): a progress event, then the image or the
// error.
type DockerfileBuildLine struct {
	Progress *BuildProgress `json:"progress,omitempty"`
	Image    *Image         `json:"image,omitempty"`
	Error    *ErrorBody     `json:"error,omitempty"`
}
