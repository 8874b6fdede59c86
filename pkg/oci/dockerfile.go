package oci

// Dockerfile builds: BuildKit's own parser (github.com/moby/buildkit
// frontend/dockerfile/parser and instructions) reads the Dockerfile, so the
// syntax (line continuations, heredocs, the escape directive, JSON and shell
// forms, variable expansion) is exactly Docker's; this file runs the
// instructions against the image store, one content-addressed layer per
// step. What is refused, and why, is in docs/SPEC.md "Dockerfile builds".

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// IntermediatePrefix starts the store names of the trees a build's RUN
// steps run on (removed after the step).
const IntermediatePrefix = "build-"

// MaxDockerfile caps a Dockerfile's size.
const MaxDockerfile = 1 << 20

// maxSteps bounds the instructions of one build (each may be a layer, and
// an image has at most maxLayers).
const maxSteps = 100

// BuildRequest is one Dockerfile build.
type BuildRequest struct {
	Dockerfile []byte
	// Context is the build context, a directory the daemon made (an
	// unpacked upload); COPY and ADD read only below it.
	Context string
	// Tag, if set, names the result: an image-store name ("myapp") or a
	// reference ("registry.example/team/app:1").
	Tag       string
	BuildArgs map[string]string
	// Network and Allow are the network policy RUN steps run under (""
	// the daemon's default).
	Network string
	Allow   []string
	// NoCache runs every step again.
	NoCache bool
}

// RunStep is one RUN of a build, run by the daemon in a root-mode sandbox
// from Image (an intermediate image of the store).
type RunStep struct {
	Image   string
	Argv    []string
	Env     map[string]string
	Cwd     string
	Root    bool // the step's USER is root
	Network string
	Allow   []string
	// Output receives the command's output as it arrives.
	Output func(stream, data string)
}

// Builders are what a build needs of the daemon.
type Builders struct {
	// Base returns the image FROM names (a store name or a reference,
	// pulled or built on first use as the daemon's policy allows).
	Base func(ctx context.Context, name string) (*image.Image, error)
	// Run runs step in a sandbox and writes the layer of what it changed
	// in the root file system (WriteUpperLayer) to layer.
	Run func(ctx context.Context, step RunStep, layer io.Writer) error
}

// buildState is the image a build has made so far.
type buildState struct {
	base   *image.Image
	key    string   // cache key of the chain so far (hex sha256)
	layers []string // diff ids (hex) of the build's own layers
	cfg    v1.Config
	shell  []string
	args   map[string]string // ARGs declared in the stage, with values
	envSet map[string]bool   // names an ENV of the Dockerfile set
}

// lineError is an invalid_argument naming the Dockerfile line of cmd.
func lineError(loc []parser.Range, format string, args ...any) error {
	line := 0
	if len(loc) > 0 {
		line = loc[0].Start.Line
	}
	return errdefs.Invalidf("dockerfile: line %d: %s", line, fmt.Sprintf(format, args...))
}

// parseError turns BuildKit's parse error into an invalid_argument naming
// the line.
func parseError(err error) error {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		return errdefs.Invalidf("dockerfile: line %d: %v", le.Locations[0][0].Start.Line, le.Unwrap())
	}
	return errdefs.Invalidf("dockerfile: %v", err)
}

// Build runs the Dockerfile of req and installs the image it makes.
func (im *Importer) Build(ctx context.Context, req BuildRequest, b Builders, progress func(apitypes.BuildProgress)) (*image.Image, error) {
	if progress == nil {
		progress = func(apitypes.BuildProgress) {}
	}
	st, metaArgs, escape, err := parseDockerfile(req.Dockerfile)
	if err != nil {
		return nil, err
	}
	run := &dockerfileRun{
		im: im, req: req, b: b, progress: progress, lex: shell.NewLex(escape),
		global: globalArgs(metaArgs, req.BuildArgs), usedArgs: map[string]bool{}, total: len(st.Commands) + 1,
	}
	s, err := run.from(ctx, st)
	if err != nil {
		return nil, err
	}
	for i, c := range st.Commands {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := run.step(ctx, s, i+2, c); err != nil {
			return nil, err
		}
	}
	if err := run.checkBuildArgs(s); err != nil {
		return nil, err
	}
	out, err := im.installBuilt(ctx, s, req.Tag)
	if err != nil {
		return nil, fmt.Errorf("dockerfile: the resulting image: %w", err)
	}
	progress(apitypes.BuildProgress{Phase: "done", Step: run.total, Steps: run.total, Image: out.Name, Digest: out.OCI.ConfigDigest})
	return out, nil
}

// parseDockerfile checks the Dockerfile's size and parses its one stage,
// the ARGs before its FROM and the escape character its words use.
func parseDockerfile(dockerfile []byte) (instructions.Stage, []instructions.ArgCommand, rune, error) {
	var none instructions.Stage
	if len(dockerfile) == 0 {
		return none, nil, 0, errdefs.Invalidf("dockerfile: required")
	}
	if len(dockerfile) > MaxDockerfile {
		return none, nil, 0, errdefs.Invalidf("dockerfile: %d bytes, at most %d", len(dockerfile), MaxDockerfile)
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return none, nil, 0, parseError(err)
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return none, nil, 0, parseError(err)
	}
	if len(stages) == 0 {
		return none, nil, 0, errdefs.Invalidf("dockerfile: no FROM")
	}
	if len(stages) > 1 {
		return none, nil, 0, lineError(stages[1].Location, "multi-stage builds are not supported (a second FROM)")
	}
	if len(stages[0].Commands) > maxSteps {
		return none, nil, 0, errdefs.Invalidf("dockerfile: %d instructions, at most %d", len(stages[0].Commands), maxSteps)
	}
	return stages[0], metaArgs, res.EscapeToken, nil
}

// globalArgs are the values of the ARGs declared before FROM: visible to
// FROM only (and to a stage's ARG of the same name without a value).
func globalArgs(metaArgs []instructions.ArgCommand, buildArgs map[string]string) map[string]string {
	global := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if v, ok := buildArgs[kv.Key]; ok {
				global[kv.Key] = v
			} else if kv.Value != nil {
				global[kv.Key] = *kv.Value
			}
		}
	}
	return global
}

// dockerfileRun is one Build in progress: what every step reads besides
// the image made so far (buildState).
type dockerfileRun struct {
	im       *Importer
	req      BuildRequest
	b        Builders
	progress func(apitypes.BuildProgress)
	lex      *shell.Lex
	global   map[string]string // ARGs before FROM
	usedArgs map[string]bool   // build args a word expansion used
	total    int               // steps, FROM included
}

// from resolves the stage's FROM (step 1) and starts the image from the
// base's configuration.
func (r *dockerfileRun) from(ctx context.Context, st instructions.Stage) (*buildState, error) {
	baseName, err := r.lex.ProcessWordWithMatches(st.BaseName, shell.EnvsFromSlice(envList(r.global)))
	if err != nil {
		return nil, lineError(st.Location, "FROM: %v", err)
	}
	if st.Platform != "" && st.Platform != "linux/amd64" {
		return nil, lineError(st.Location, "FROM --platform=%s: only linux/amd64 images run here", st.Platform)
	}
	r.progress(apitypes.BuildProgress{Phase: "step", Step: 1, Steps: r.total, Instruction: st.SourceCode})
	base, err := r.b.Base(ctx, baseName.Result)
	if err != nil {
		return nil, fmt.Errorf("dockerfile: line %d: FROM %s: %w", lineOf(st.Location), baseName.Result, err)
	}
	s := &buildState{base: base, key: chain("", "FROM", base.Digest), args: map[string]string{}, envSet: map[string]bool{}, shell: []string{"/bin/sh", "-c"}}
	s.cfg.Env = envList(base.Env)
	if base.OCI != nil {
		s.cfg.WorkingDir, s.cfg.User = base.OCI.WorkingDir, base.OCI.ConfigUser
		s.cfg.Entrypoint, s.cfg.Cmd = base.OCI.Entrypoint, base.OCI.Cmd
		s.cfg.Labels = maps(base.OCI.Labels)
	} else if base.User.Name != "" && base.User.UID != 0 {
		// A language image runs as its sandbox user.
		s.cfg.User = base.User.Name
	}
	return s, nil
}

// step runs instruction c, number step of the build: its words expanded,
// then either a change of the configuration or a layer (RUN, COPY, ADD).
func (r *dockerfileRun) step(ctx context.Context, s *buildState, step int, c instructions.Command) error {
	loc := c.Location()
	// Word expansion uses the ARGs and ENVs so far, as Docker does.
	env := s.expandEnv()
	if ex, ok := c.(instructions.SupportsSingleWordExpansion); ok {
		if err := ex.Expand(func(w string) (string, error) {
			res, err := r.lex.ProcessWordWithMatches(w, shell.EnvsFromSlice(env))
			for m := range res.Matched {
				r.usedArgs[m] = true
			}
			return res.Result, err
		}); err != nil {
			return lineError(loc, "%s: %v", strings.ToUpper(c.Name()), err)
		}
	}
	ev := apitypes.BuildProgress{Phase: "step", Step: step, Steps: r.total, Instruction: instructionText(c)}
	if !r.configure(s, c) {
		if err := r.layerStep(ctx, s, c, &ev); err != nil {
			return err
		}
	}
	if ev.Phase == "step" {
		r.progress(ev)
	}
	return nil
}

// configure applies an instruction that changes only the image's
// configuration (or nothing: MAINTAINER); false for any other.
func (r *dockerfileRun) configure(s *buildState, c instructions.Command) bool {
	switch c := c.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			s.cfg.Env = setEnv(s.cfg.Env, kv.Key, kv.Value)
			s.envSet[kv.Key] = true
		}
	case *instructions.ArgCommand:
		r.declareArgs(s, c)
	case *instructions.WorkdirCommand:
		p := c.Path
		if !path.IsAbs(p) {
			p = path.Join("/", s.cfg.WorkingDir, p)
		}
		s.cfg.WorkingDir = path.Clean(p)
	case *instructions.UserCommand:
		s.cfg.User = c.User
	case *instructions.LabelCommand:
		if s.cfg.Labels == nil {
			s.cfg.Labels = map[string]string{}
		}
		for _, kv := range c.Labels {
			s.cfg.Labels[kv.Key] = kv.Value
		}
	case *instructions.EntrypointCommand:
		s.cfg.Entrypoint = s.cmdLine(c.ShellDependantCmdLine)
		// As Docker does: a new ENTRYPOINT drops the base's CMD.
		s.cfg.Cmd = nil
	case *instructions.CmdCommand:
		s.cfg.Cmd = s.cmdLine(c.ShellDependantCmdLine)
	case *instructions.ExposeCommand:
		expose(s, c.Ports)
	case *instructions.ShellCommand:
		s.shell = c.Shell
		s.cfg.Shell = c.Shell
	case *instructions.MaintainerCommand:
	default:
		return false
	}
	return true
}

// declareArgs gives the stage's ARGs their values: a build arg, else the
// ARG's default, else the global ARG of the same name.
func (r *dockerfileRun) declareArgs(s *buildState, c *instructions.ArgCommand) {
	for _, kv := range c.Args {
		v, given := r.req.BuildArgs[kv.Key]
		if !given && kv.Value != nil {
			v, given = *kv.Value, true
		}
		if !given {
			if gv, ok := r.global[kv.Key]; ok {
				v = gv
			}
		}
		s.args[kv.Key] = v
	}
}

// expose adds ports (tcp when no protocol is named) to the image's
// exposed ports.
func expose(s *buildState, ports []string) {
	if s.cfg.ExposedPorts == nil {
		s.cfg.ExposedPorts = map[string]struct{}{}
	}
	for _, p := range ports {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		s.cfg.ExposedPorts[p] = struct{}{}
	}
}

// layerStep runs an instruction that makes a layer (RUN, COPY, ADD) and
// refuses every other.
func (r *dockerfileRun) layerStep(ctx context.Context, s *buildState, c instructions.Command, ev *apitypes.BuildProgress) error {
	loc := c.Location()
	switch c := c.(type) {
	case *instructions.RunCommand:
		return r.im.stepRun(ctx, r.req, r.b, s, c, ev, r.usedArgs, r.progress)
	case *instructions.CopyCommand:
		if c.From != "" {
			return lineError(loc, "COPY --from: multi-stage builds are not supported")
		}
		return r.im.stepCopy(r.req, s, loc, "COPY", c.SourcesAndDest, c.Chown, c.Chmod, c.ExcludePatterns, c.Parents, ev)
	case *instructions.AddCommand:
		for _, src := range c.SourcePaths {
			if isURL(src) {
				return lineError(loc, "ADD %s: URLs are refused: the build fetches nothing outside its RUN steps' network policy (RUN curl under --network allowlist instead)", src)
			}
			if isArchiveName(src) {
				return lineError(loc, "ADD %s: archives are not unpacked by builds here (COPY it and RUN tar)", src)
			}
		}
		if c.Checksum != "" || c.KeepGitDir != nil || c.Unpack != nil {
			return lineError(loc, "ADD: --checksum, --keep-git-dir and --unpack are not supported")
		}
		return r.im.stepCopy(r.req, s, loc, "ADD", c.SourcesAndDest, c.Chown, c.Chmod, c.ExcludePatterns, false, ev)
	default:
		return lineError(loc, "%s is refused: %s", strings.ToUpper(c.Name()), refusedWhy(c.Name()))
	}
}

// checkBuildArgs refuses a build arg that no ARG declares and no word used.
func (r *dockerfileRun) checkBuildArgs(s *buildState) error {
	for k := range r.req.BuildArgs {
		if _, declared := s.args[k]; !declared && !r.usedArgs[k] {
			if _, g := r.global[k]; !g {
				return errdefs.Invalidf("build_args: %q is not an ARG of the Dockerfile", k)
			}
		}
	}
	return nil
}

// instructionText is the instruction as written (after expansion).
func instructionText(c instructions.Command) string {
	if s, ok := c.(fmt.Stringer); ok {
		return s.String()
	}
	return strings.ToUpper(c.Name())
}

// refusedWhy says why an instruction is refused (docs/SPEC.md "Dockerfile
// builds").
func refusedWhy(name string) string {
	switch strings.ToLower(name) {
	case "volume":
		return "a sandbox's storage is its own disk and named volumes (volume_create), mounted at create time"
	case "healthcheck":
		return "nothing of the image runs as a service; templates have their own readiness check"
	case "onbuild":
		return "triggers would run a base image's instructions unseen in this Dockerfile"
	case "stopsignal":
		return "the daemon's init stops a sandbox, never the image's command"
	}
	return "not supported"
}

func lineOf(loc []parser.Range) int {
	if len(loc) == 0 {
		return 0
	}
	return loc[0].Start.Line
}

func maps(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// expandEnv is the environment words are expanded in: the stage's ARGs,
// overridden by its ENVs.
func (s *buildState) expandEnv() []string {
	env := envList(s.args)
	for _, kv := range s.cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = setEnv(env, k, v)
	}
	return env
}

// cmdLine is an ENTRYPOINT's or CMD's argv: the JSON form as it is, the
// shell form through the SHELL.
func (s *buildState) cmdLine(c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		return append(slices.Clone(s.shell), strings.Join(c.CmdLine, " "))
	}
	return c.CmdLine
}

func envList(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+m[k])
	}
	return out
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// chain is the cache key of a step: its parent's key and what the step
// does (BuildKit's cache keys are the same idea: the parent chain plus the
// operation's definition plus, for copies, the content's digest).
func chain(parent string, parts ...string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", parent)
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func isURL(s string) bool {
	l := strings.ToLower(s)
	return strings.HasPrefix(l, "http://") || strings.HasPrefix(l, "https://") || strings.HasPrefix(l, "git@") || strings.HasPrefix(l, "git://")
}

func isArchiveName(s string) bool {
	l := strings.ToLower(s)
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(l, ext) {
			return true
		}
	}
	return false
}

// cacheDir holds one file per cache key naming the layer (diff id) the
// step made.
func (im *Importer) cacheDir() string { return filepath.Join(im.o.Store.Dir(), "buildcache") }

// cached returns the diff id stored for key, "" when there is none or its
// layer is gone.
func (im *Importer) cached(key string) string {
	b, err := os.ReadFile(filepath.Join(im.cacheDir(), key))
	if err != nil {
		return ""
	}
	d := strings.TrimSpace(string(b))
	if !isHex64(d) {
		return ""
	}
	if _, err := os.Stat(filepath.Join(im.layers, d)); err != nil {
		return ""
	}
	return d
}

// remember records that key made layer diffID (after the layer is stored:
// a crash between the two leaves a layer no key names, which gc removes).
func (im *Importer) remember(key, diffID string) error {
	if err := os.MkdirAll(im.cacheDir(), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(im.cacheDir(), ".tmp-"+key)
	if err := os.WriteFile(tmp, []byte(diffID+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(im.cacheDir(), key))
}

// storeLayer writes a layer through write into the layer store and
// returns its diff id.
func (im *Importer) storeLayer(write func(io.Writer) error) (string, error) {
	f, err := os.CreateTemp(im.layers, ".partial-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	werr := write(io.MultiWriter(f, h))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", werr
	}
	d := hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(f.Name(), filepath.Join(im.layers, d)); err != nil {
		return "", err
	}
	return d, nil
}

// stepRun runs a RUN instruction, or takes its layer from the cache.
func (im *Importer) stepRun(ctx context.Context, req BuildRequest, b Builders, s *buildState, c *instructions.RunCommand, ev *apitypes.BuildProgress, usedArgs map[string]bool, progress func(apitypes.BuildProgress)) error {
	loc := c.Location()
	for _, f := range c.FlagsUsed {
		return lineError(loc, "RUN --%s is refused: mounts, secrets, ssh and per-step network or security options are not supported; the build's network option applies to every RUN", f)
	}
	if len(c.Files) > 0 {
		return lineError(loc, "RUN with a heredoc is not supported")
	}
	argv := c.CmdLine
	if c.PrependShell {
		argv = append(slices.Clone(s.shell), strings.Join(c.CmdLine, " "))
	}
	if strings.TrimSpace(strings.Join(c.CmdLine, "")) == "" {
		return lineError(loc, "RUN: empty command")
	}
	// ARGs are the command's environment too; those given as build args
	// are part of the key (BuildKit keys a RUN by the args it sees).
	env := s.expandEnv()
	argvJSON, _ := json.Marshal(argv)
	key := chain(s.key, "RUN", string(argvJSON), strings.Join(env, "\x00"), s.cfg.WorkingDir, s.cfg.User, req.Network, strings.Join(req.Allow, ","))
	for k := range s.args {
		usedArgs[k] = true
	}
	ev.Instruction = "RUN " + strings.Join(c.CmdLine, " ")
	if d := im.cached(key); d != "" && !req.NoCache {
		s.key, s.layers = key, append(s.layers, d)
		ev.Cached, ev.Layer = true, "sha256:"+d
		return nil
	}
	if len(s.layers) >= maxLayers {
		return lineError(loc, "more than %d layers", maxLayers)
	}
	progress(*ev)
	ev.Phase = "" // reported already
	// An intermediate image of the state so far, run in a sandbox, then
	// removed: its tree is only the lower layer of the step's sandbox.
	// Its digest is the chain's plus a nonce: two builds of the same chain
	// at once each run on a tree of their own, and remove only theirs.
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	interDigest := chain(s.key, "intermediate", hex.EncodeToString(nonce))
	inter, err := im.installState(ctx, s, IntermediatePrefix+interDigest[:16], interDigest, nil)
	if err != nil {
		return fmt.Errorf("dockerfile: line %d: RUN: %w", lineOf(loc), err)
	}
	// The step's sandbox is gone when Run returns; a tree left by a crash
	// is removed as abandoned (removeAbandoned).
	defer im.o.Store.Remove(inter.Name)
	// The command's environment: the intermediate image's (its HOME and
	// USER those of the step's USER) over the ARGs.
	runEnv := maps(s.args)
	if runEnv == nil {
		runEnv = map[string]string{}
	}
	for k, v := range inter.Env {
		runEnv[k] = v
	}
	start := time.Now()
	d, err := im.storeLayer(func(w io.Writer) error {
		return b.Run(ctx, RunStep{
			Image: inter.Name, Argv: argv, Env: runEnv, Cwd: s.cfg.WorkingDir, Root: inter.User.UID == 0,
			Network: req.Network, Allow: req.Allow,
			Output: func(stream, data string) {
				progress(apitypes.BuildProgress{Phase: "output", Step: ev.Step, Steps: ev.Steps, Stream: stream, Output: data})
			},
		}, w)
	})
	if err != nil {
		return fmt.Errorf("dockerfile: line %d: RUN: %w", lineOf(loc), err)
	}
	if err := im.remember(key, d); err != nil {
		return err
	}
	s.key, s.layers = key, append(s.layers, d)
	progress(apitypes.BuildProgress{Phase: "step", Step: ev.Step, Steps: ev.Steps, Instruction: ev.Instruction, Layer: "sha256:" + d, Seconds: time.Since(start).Seconds()})
	return nil
}

// installState installs the tree of s (the base's tree and the build's
// layers) as image name with the given digest, for a RUN step or as the
// result.
func (im *Importer) installState(ctx context.Context, s *buildState, name, digest string, refs []string) (*image.Image, error) {
	rec := &image.Image{Name: name, Digest: digest, Env: envMap(s.cfg.Env)}
	info := &image.OCIInfo{References: refs, WorkingDir: s.cfg.WorkingDir, ConfigUser: s.cfg.User, Entrypoint: s.cfg.Entrypoint, Cmd: s.cfg.Cmd, Labels: maps(s.cfg.Labels), ConfigDigest: "sha256:" + digest}
	if s.base.OCI != nil {
		info.Layers = append(info.Layers, s.base.OCI.Layers...)
	}
	for _, d := range s.layers {
		info.Layers = append(info.Layers, "sha256:"+d)
	}
	rec.OCI = info
	fill := func(rootfs string) error {
		// The base's tree as it is stored (reflinked where the file system
		// can), then the build's layers through the same checks as a
		// pulled layer's.
		if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", s.base.Rootfs+"/.", rootfs).CombinedOutput(); err != nil {
			return fmt.Errorf("copy base image %s: %v: %s", s.base.Name, err, out)
		}
		root, err := os.OpenRoot(rootfs)
		if err != nil {
			return err
		}
		defer root.Close()
		bud := &budget{left: im.o.MaxSize, max: im.o.MaxSize}
		for i, d := range s.layers {
			f, err := os.Open(filepath.Join(im.layers, d))
			if err != nil {
				return err
			}
			err = applyLayer(root, &countingReader{r: f, b: bud}, fmt.Sprintf("%d (sha256:%s)", i, d), bud, im.o.MaxID)
			f.Close()
			if err != nil {
				return err
			}
		}
		if wd := s.cfg.WorkingDir; wd != "" && wd != "/" {
			// WORKDIR makes its directory when it is missing, as Docker's does.
			if err := root.MkdirAll(strings.TrimPrefix(wd, "/"), 0o755); err != nil {
				if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTDIR) {
					// A COPY put a file where the WORKDIR goes: the
					// Dockerfile's doing, not the daemon's.
					return errdefs.Invalidf("WORKDIR %s: a file of the image is in the way: %v", wd, err)
				}
				return fmt.Errorf("WORKDIR %s: %w", wd, err)
			}
		}
		if rec.User, err = resolveUser(root, s.cfg.User, im.o.MaxID); err != nil {
			return err
		}
		// HOME and USER of the base's user (the store records them with
		// its Env) follow a USER that changed the account; ones the
		// Dockerfile set stay.
		for k, v := range map[string][2]string{"HOME": {s.base.User.Home, rec.User.Home}, "USER": {s.base.User.Name, rec.User.Name}} {
			if cur, ok := rec.Env[k]; (!ok || cur == v[0] && !s.envSet[k]) && v[1] != "" {
				rec.Env[k] = v[1]
			}
		}
		return nil
	}
	return im.o.Store.InstallTree(ctx, rec, fill)
}

// installBuilt installs the build's result under its config digest, and
// names it tag.
func (im *Importer) installBuilt(ctx context.Context, s *buildState, tag string) (*image.Image, error) {
	cfg := v1.ConfigFile{Architecture: "amd64", OS: "linux", Config: s.cfg, RootFS: v1.RootFS{Type: "layers"}}
	if s.base.OCI != nil {
		for _, l := range s.base.OCI.Layers {
			h, err := v1.NewHash(l)
			if err != nil {
				return nil, err
			}
			cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, h)
		}
	} else {
		// A language image has no layers of its own: its digest stands for
		// its tree (docs/SPEC.md: such images are not exported).
		cfg.Config.Labels = maps(cfg.Config.Labels)
		if cfg.Config.Labels == nil {
			cfg.Config.Labels = map[string]string{}
		}
		cfg.Config.Labels["org.sandboxrunner.base"] = s.base.Name + "@sha256:" + s.base.Digest
	}
	for _, d := range s.layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, v1.Hash{Algorithm: "sha256", Hex: d})
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	digest := hex.EncodeToString(sum[:])
	name := NamePrefix + digest[:12]
	var refs []string
	if tag != "" {
		if IsReference(tag) {
			r, err := ParseReference("tag", tag)
			if err != nil {
				return nil, err
			}
			refs = []string{canonical(r)}
		} else {
			name = tag
		}
	}
	out, err := im.installState(ctx, s, name, digest, refs)
	if err != nil {
		return nil, err
	}
	for _, r := range refs {
		if err := im.setRef(r, out.Name); err != nil {
			return nil, err
		}
	}
	return out, nil
}
