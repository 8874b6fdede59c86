package api

import (
	"bufio"
	"io"
	"net/http"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// runCode is run_code: POST /v1/run with an engine.RunCodeRequest. With
// ?stream=true the answer is NDJSON like exec's: the steps' output as
// {"stream","data"} lines while they run, then one {"result": RunResult}
// line (or {"error": ...}); errors before any output keep their status.
func (s *server) runCode(w http.ResponseWriter, r *http.Request) {
	var req engine.RunCodeRequest
	stream, err := s.decodeStreamable(w, r, &req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !stream {
		res, err := s.e.RunCode(r.Context(), req, nil)
		s.reply(w, r, http.StatusOK, res, err)
		return
	}
	st := &execStream{ndjsonStream: newNDJSONStream(w)}
	res, err := s.e.RunCode(r.Context(), req, st.output)
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return execLine{Error: &b} })
		return
	}
	st.flush()
	st.send(execLine{Result: res})
}

// listRuns is run_list: GET /v1/runs?limit=&language=&success=.
func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	limit, err := queryInt(r, "limit", 32)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	success, err := queryOptBool(r, "success")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := engine.RunFilter{Language: r.URL.Query().Get("language"), Limit: int(limit), Success: success}
	l, err := s.e.ListRuns(r.Context(), f)
	s.reply(w, r, http.StatusOK, apitypes.RunList{Runs: nonNil(l)}, err)
}

// getRun is run_get: GET /v1/runs/{id}?max_bytes= (of each log; default 64 KiB).
func (s *server) getRun(w http.ResponseWriter, r *http.Request) {
	max, err := queryInt(r, "max_bytes", 64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if max == 0 {
		max = 64 << 10
	}
	run, err := s.e.GetRun(r.Context(), r.PathValue("id"), max)
	s.reply(w, r, http.StatusOK, run, err)
}

// languages is languages_list: GET /v1/languages.
func (s *server) languages(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.Languages(r.Context())
	s.reply(w, r, http.StatusOK, apitypes.LanguageList{Languages: nonNil(l)}, err)
}

// buildLine is one line of the image build stream.
type buildLine = apitypes.BuildLine

// buildImage builds (if out of date) the image of recipe {name}, streaming
// its log as NDJSON; the whole log is also kept in the image store. The
// stream (and its 200) starts with the first log line: an error known
// before that (a malformed or unknown name) is a plain error answer with
// its status, as for /v1/run.
func (s *server) buildImage(w http.ResponseWriter, r *http.Request) {
	st := newNDJSONStream(w)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			st.send(buildLine{Log: sc.Text()})
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	build := s.e.EnsureImage
	if r.URL.Query().Get("vm") == "true" {
		build = s.e.EnsureVMImage // a guest image (images build --vm NAME)
	}
	img, err := build(r.Context(), r.PathValue("name"), pw)
	pw.Close()
	<-done
	if err != nil {
		s.log.Error("image build failed", "image", r.PathValue("name"), "err", err)
		st.fail(s, r, err, func(b errorBody) any { return buildLine{Error: &b} })
		return
	}
	st.send(buildLine{Image: img})
}

// pullImage is image_pull: POST /v1/images/pull with an ImagePullRequest,
// answered with NDJSON ImageLines: {"progress": ...} per phase, then
// {"image": ...} or {"error": ...}. An error before the first phase (a
// malformed reference, refused credentials) is a plain error answer.
func (s *server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req apitypes.ImagePullRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st := newNDJSONStream(w)
	img, err := s.e.PullImage(r.Context(), req.Reference, func(p apitypes.ImageProgress) { st.send(apitypes.ImageLine{Progress: &p}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return apitypes.ImageLine{Error: &b} })
		return
	}
	st.send(apitypes.ImageLine{Image: img})
}

// importImage is POST /v1/images/import?reference=REF with the archive as
// the body (a docker save tar, or a tar of an OCI layout; at most
// images.max_size), answered like pullImage. reference picks one image of
// an archive holding several.
func (s *server) importImage(w http.ResponseWriter, r *http.Request) {
	st := newNDJSONStream(w)
	img, err := s.e.ImportImageFrom(r.Context(), r.Body, r.URL.Query().Get("reference"), func(p apitypes.ImageProgress) { st.send(apitypes.ImageLine{Progress: &p}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return apitypes.ImageLine{Error: &b} })
		return
	}
	st.send(apitypes.ImageLine{Image: img})
}

// buildDockerfile is POST /v1/images/dockerfile?dockerfile=PATH&tag=T
// &build_arg=K=V&network=N&allow=H&no_cache=true with the build context as
// the body (a tar, optionally gzip or zstd; the Dockerfile is read from it
// at PATH, default "Dockerfile"), answered with NDJSON DockerfileBuildLines.
func (s *server) buildDockerfile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := apitypes.DockerfileBuildRequest{
		DockerfilePath: q.Get("dockerfile"), Tag: q.Get("tag"), Network: q.Get("network"), Allow: q["allow"],
		NoCache: q.Get("no_cache") == "true",
	}
	if req.DockerfilePath == "" {
		req.DockerfilePath = "Dockerfile"
	}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			s.writeError(w, r, errdefs.Invalidf("build_arg: %q: KEY=VALUE expected", kv))
			return
		}
		if req.BuildArgs == nil {
			req.BuildArgs = map[string]string{}
		}
		req.BuildArgs[k] = v
	}
	st := newNDJSONStream(w)
	img, err := s.e.BuildDockerfile(r.Context(), req, r.Body, func(p apitypes.BuildProgress) { st.send(apitypes.DockerfileBuildLine{Progress: &p}) })
	if err != nil {
		st.fail(s, r, err, func(b errorBody) any { return apitypes.DockerfileBuildLine{Error: &b} })
		return
	}
	st.send(apitypes.DockerfileBuildLine{Image: img})
}

// pruneImages removes stale images no sandbox uses.
func (s *server) pruneImages(w http.ResponseWriter, r *http.Request) {
	removed, err := s.e.PruneImages(r.Context())
	s.reply(w, r, http.StatusOK, imageList{Images: nonNil(removed)}, err)
}

// removeImage deletes the built images of recipe {name}.
func (s *server) removeImage(w http.ResponseWriter, r *http.Request) {
	if err := s.e.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.ImageDeleteResult{Name: r.PathValue("name"), Deleted: true})
}
