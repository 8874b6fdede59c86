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
