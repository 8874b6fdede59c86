package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Run types: the shared definitions of pkg/apitypes.
type (
	// RunCodeRequest is the body of POST /v1/run (run_code).
	RunCodeRequest = apitypes.RunCodeRequest
	// RunResult is the outcome of run_code.
	RunResult = apitypes.RunResult
	// RunMetadata is a run record's metadata.json.
	RunMetadata = apitypes.RunMetadata
	// RunRecord is a stored run with the start of its logs.
	RunRecord = apitypes.RunRecord
	// LanguageInfo is one entry of languages_list.
	LanguageInfo = apitypes.LanguageInfo
	// RunFilter selects run records.
	RunFilter = apitypes.RunFilter
)

// RunCode runs code in a sandbox (an ephemeral one unless SandboxID is set).
func (c *Client) RunCode(ctx context.Context, req RunCodeRequest) (*RunResult, error) {
	var res RunResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/run", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RunCodeStream is RunCode whose onOutput sees the steps' output as it
// arrives (POST /v1/run?stream=true); the result holds it either way.
func (c *Client) RunCodeStream(ctx context.Context, req RunCodeRequest, onOutput OutputFunc) (*RunResult, error) {
	if onOutput == nil {
		return c.RunCode(ctx, req)
	}
	return postStream(ctx, c, "/v1/run", url.Values{"stream": {"true"}}, req, "run", func(line *ExecLine) (bool, *RunResult, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Result != nil:
			return true, line.Result, nil
		case line.Stream != "":
			data, err := decoded(line)
			if err != nil {
				return true, nil, fmt.Errorf("read run stream: %w", err)
			}
			onOutput(line.Stream, data)
		}
		return false, nil, nil
	})
}

// Runs lists run records, newest first.
func (c *Client) Runs(ctx context.Context, f RunFilter) ([]RunMetadata, error) {
	q := url.Values{}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Language != "" {
		q.Set("language", f.Language)
	}
	if f.Success != nil {
		q.Set("success", strconv.FormatBool(*f.Success))
	}
	var l struct {
		Runs []RunMetadata `json:"runs"`
	}
	return l.Runs, c.doJSON(ctx, http.MethodGet, "/v1/runs", q, nil, &l)
}

// Run reads a run record with up to maxLog bytes of each log (0: the daemon's default).
func (c *Client) Run(ctx context.Context, id string, maxLog int64) (*RunRecord, error) {
	q := url.Values{}
	if maxLog > 0 {
		q.Set("max_bytes", strconv.FormatInt(maxLog, 10))
	}
	var r RunRecord
	if err := c.doJSON(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id), q, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ReplayRun re-runs run id in a fresh sandbox and compares the new run
// with it (run_replay).
func (c *Client) ReplayRun(ctx context.Context, req apitypes.RunReplayRequest) (*apitypes.RunReplay, error) {
	var r apitypes.RunReplay
	if err := c.doJSON(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(req.RunID)+"/replay", nil, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Languages lists the enabled languages and whether their images are built.
func (c *Client) Languages(ctx context.Context) ([]LanguageInfo, error) {
	var l struct {
		Languages []LanguageInfo `json:"languages"`
	}
	return l.Languages, c.doJSON(ctx, http.MethodGet, "/v1/languages", nil, nil, &l)
}

// BuildImage builds recipe name's image unless it is up to date; log
// receives the build log line by line as it happens.
func (c *Client) BuildImage(ctx context.Context, name string, log func(line string)) (*Image, error) {
	return c.buildImage(ctx, name, nil, log)
}

// BuildVMImage builds the VM guest image of name (linux, or a language
// made into a guest) unless it is up to date, and makes it bootable.
func (c *Client) BuildVMImage(ctx context.Context, name string, log func(line string)) (*Image, error) {
	return c.buildImage(ctx, name, url.Values{"vm": {"true"}}, log)
}

func (c *Client) buildImage(ctx context.Context, name string, q url.Values, log func(line string)) (*Image, error) {
	type buildLine struct {
		Log   string     `json:"log"`
		Image *Image     `json:"image"`
		Error *ErrorBody `json:"error"`
	}
	return postStream(ctx, c, "/v1/images/"+url.PathEscape(name)+"/build", q, nil, "build", func(line *buildLine) (bool, *Image, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Image != nil:
			return true, line.Image, nil
		case log != nil:
			log(line.Log)
		}
		return false, nil, nil
	})
}

// PullImage pulls the image ref names from its registry into the daemon's
// store; progress, if not nil, sees each phase.
func (c *Client) PullImage(ctx context.Context, ref string, progress func(apitypes.ImageProgress)) (*Image, error) {
	return postStream(ctx, c, "/v1/images/pull", nil, apitypes.ImagePullRequest{Reference: ref}, "pull", imageLines(progress))
}

// ImportImage uploads an archive (a docker save tar, or a tar of an OCI
// layout) and installs its image; ref picks one of several in it.
func (c *Client) ImportImage(ctx context.Context, archive io.Reader, ref string, progress func(apitypes.ImageProgress)) (*Image, error) {
	var q url.Values
	if ref != "" {
		q = url.Values{"reference": {ref}}
	}
	return postStream(ctx, c, "/v1/images/import", q, archive, "import", imageLines(progress))
}

// BuildDockerfile uploads a build context (a tar) and builds the
// Dockerfile at req.DockerfilePath in it; progress sees each step.
func (c *Client) BuildDockerfile(ctx context.Context, contextTar io.Reader, req apitypes.DockerfileBuildRequest, progress func(apitypes.BuildProgress)) (*Image, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("dockerfile", req.DockerfilePath)
	set("tag", req.Tag)
	set("network", req.Network)
	if req.NoCache {
		q.Set("no_cache", "true")
	}
	for _, a := range req.Allow {
		q.Add("allow", a)
	}
	for k, v := range req.BuildArgs {
		q.Add("build_arg", k+"="+v)
	}
	return postStream(ctx, c, "/v1/images/dockerfile", q, contextTar, "build", func(line *apitypes.DockerfileBuildLine) (bool, *Image, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Image != nil:
			return true, line.Image, nil
		case line.Progress != nil && progress != nil:
			progress(*line.Progress)
		}
		return false, nil, nil
	})
}

func imageLines(progress func(apitypes.ImageProgress)) func(*apitypes.ImageLine) (bool, *Image, error) {
	return func(line *apitypes.ImageLine) (bool, *Image, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Image != nil:
			return true, line.Image, nil
		case line.Progress != nil && progress != nil:
			progress(*line.Progress)
		}
		return false, nil, nil
	}
}

// PruneImages removes the stale images no sandbox uses and returns them.
func (c *Client) PruneImages(ctx context.Context) ([]Image, error) {
	var l struct {
		Images []Image `json:"images"`
	}
	return l.Images, c.doJSON(ctx, http.MethodPost, "/v1/images/prune", nil, nil, &l)
}

// RemoveImage deletes recipe name's built images.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/images/"+url.PathEscape(name), nil, nil, nil)
}
