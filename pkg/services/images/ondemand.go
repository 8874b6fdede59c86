package images

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Images on first use: a request for an image that is not built builds it
// (images.build_on_demand). One build per image runs at a time; callers
// that arrive meanwhile wait for the same build (singleflight) and all see
// its phases on their output function.

type buildOutputKey struct{}

// WithBuildOutput makes f receive the phases of an image build the request
// carried by ctx waits for.
func WithBuildOutput(ctx context.Context, f sandbox.OutputFunc) context.Context {
	if f == nil {
		return ctx
	}
	return context.WithValue(ctx, buildOutputKey{}, f)
}

// imageBuilds fans one build's progress out to every caller waiting for it.
type imageBuilds struct {
	mu      sync.Mutex
	running map[string]*imageBuild
}

type imageBuild struct {
	done    chan struct{}
	err     error
	mu      sync.Mutex
	waiters []sandbox.OutputFunc
}

func (b *imageBuild) say(format string, args ...any) {
	line := []byte(fmt.Sprintf(format, args...) + "\n")
	b.mu.Lock()
	ws := append([]sandbox.OutputFunc(nil), b.waiters...)
	b.mu.Unlock()
	for _, w := range ws {
		w("stderr", line)
	}
}

// phaseWriter passes the builder's progress lines ("HH:MM:SS image NAME:
// ...") to the waiters and drops mmdebstrap's own output, which goes to the
// daemon's log only at debug level.
type phaseWriter struct {
	b      *imageBuild
	marker string
	buf    bytes.Buffer
}

func (w *phaseWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line) // incomplete: keep for the next write
			return len(p), nil
		}
		if i := strings.Index(line, w.marker); i >= 0 {
			w.b.say("%s", strings.TrimRight(line, "\n"))
		}
	}
}

// EnsureOnDemand builds image name if it is not built, build on demand
// is on and a recipe of that name exists; otherwise it leaves the request to
// fail (or succeed) where it would have.
func (s *Service) EnsureOnDemand(ctx context.Context, name string) error {
	if _, err := s.images.Get(name); err == nil || !s.cfg.BuildOnDemand {
		return nil
	}
	if _, ok := s.catalog.Recipe(name); !ok {
		return nil
	}
	out, _ := ctx.Value(buildOutputKey{}).(sandbox.OutputFunc)
	s.builds.mu.Lock()
	if s.builds.running == nil {
		s.builds.running = map[string]*imageBuild{}
	}
	b := s.builds.running[name]
	first := b == nil
	if first {
		b = &imageBuild{done: make(chan struct{})}
		s.builds.running[name] = b
	}
	if out != nil {
		b.mu.Lock()
		b.waiters = append(b.waiters, out)
		b.mu.Unlock()
	}
	s.builds.mu.Unlock()
	if first {
		// The build outlives the request that started it: others may be
		// waiting for it, and a half-built image is wasted work.
		go func() {
			b.say("image %s: not built yet; building it now (first use)", name)
			s.onBuild(name, "started")
			_, err := s.Ensure(context.Background(), name, &phaseWriter{b: b, marker: " image " + name + ": "})
			outcome := "built"
			if err != nil {
				outcome = "failed"
				b.say("image %s: build failed: %v", name, err)
			} else {
				b.say("image %s: ready", name)
				s.PruneStale(context.Background())
			}
			s.onBuild(name, outcome)
			b.err = err
			s.builds.mu.Lock()
			delete(s.builds.running, name)
			s.builds.mu.Unlock()
			close(b.done)
		}()
	} else if out != nil {
		out("stderr", []byte(fmt.Sprintf("image %s: waiting for the build in progress\n", name)))
	}
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "image %s is still being built; it will be ready for a later request", name)
	}
}
