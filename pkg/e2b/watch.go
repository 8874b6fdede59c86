package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem"
)

// Directory watching polls: every pollInterval a command in the sandbox
// lists the tree (name, type, mtime, size) and the difference from the
// last listing becomes envd's events. The agent has no inotify op, and a
// poll sees what any process did, as inotify would.
const pollInterval = 250 * time.Millisecond

// maxWatchers bounds the polling watchers of one sandbox.
const maxWatchers = 16

const watchScript = `[ -e "$1" ] || { echo "$1: no such file or directory" >&2; exit 2; }
[ -d "$1" ] || { echo "$1: not a directory" >&2; exit 3; }
exec find -P "$1" -mindepth 1 -maxdepth "$2" -printf '%y %T@ %s %P\0'`

// snapshot maps a relative name to its type, mtime and size.
type snapshot map[string]string

func parseSnapshot(out []byte) snapshot {
	snap := snapshot{}
	for _, rec := range strings.Split(string(out), "\x00") {
		f := strings.SplitN(rec, " ", 4)
		if len(f) == 4 {
			snap[f[3]] = f[0] + " " + f[1] + " " + f[2]
		}
	}
	return snap
}

// diff is the events that lead from old to cur: a new name is a create
// (and a write when it is a non-empty file), a changed one a write, a
// vanished one a remove.
func diff(old, cur snapshot) []*filesystem.FilesystemEvent {
	var evs []*filesystem.FilesystemEvent
	names := make([]string, 0, len(cur))
	for n := range cur {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		was, ok := old[n]
		now := cur[n]
		switch {
		case !ok:
			evs = append(evs, &filesystem.FilesystemEvent{Name: n, Type: filesystem.EventType_EVENT_TYPE_CREATE})
			if strings.HasPrefix(now, "f ") && !strings.HasSuffix(now, " 0") {
				evs = append(evs, &filesystem.FilesystemEvent{Name: n, Type: filesystem.EventType_EVENT_TYPE_WRITE})
			}
		case was != now && !strings.HasPrefix(now, "d "):
			evs = append(evs, &filesystem.FilesystemEvent{Name: n, Type: filesystem.EventType_EVENT_TYPE_WRITE})
		}
	}
	var gone []string
	for n := range old {
		if _, ok := cur[n]; !ok {
			gone = append(gone, n)
		}
	}
	sort.Strings(gone)
	for _, n := range gone {
		evs = append(evs, &filesystem.FilesystemEvent{Name: n, Type: filesystem.EventType_EVENT_TYPE_REMOVE})
	}
	return evs
}

// watcher polls one directory of one sandbox.
type watcher struct {
	id      string
	sandbox string
	cancel  context.CancelFunc
	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	err     error
	notify  chan struct{}
}

type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher
}

func newWatchers() *watchers { return &watchers{m: map[string]*watcher{}} }

// start lists the directory once (so that a missing one fails the call)
// and then polls it until stopped.
func (s *Server) startWatch(ctx context.Context, c *envdCall, dir string, recursive bool) (*watcher, error) {
	depth := "1"
	if recursive {
		depth = "64"
	}
	ws := s.watch
	ws.mu.Lock()
	n := 0
	for _, w := range ws.m {
		if w.sandbox == c.sb.ID {
			n++
		}
	}
	ws.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("sandbox has %d directory watchers, the most allowed", n))
	}
	out, err := s.run(ctx, c, c.user, watchScript, dir, depth)
	if err != nil {
		return nil, connectErr(err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	wctx, cancel := context.WithCancel(context.Background())
	w := &watcher{id: hex.EncodeToString(b[:]), sandbox: c.sb.ID, cancel: cancel, notify: make(chan struct{}, 1)}
	ws.mu.Lock()
	ws.m[w.id] = w
	ws.mu.Unlock()
	go func() {
		prev := parseSnapshot(out)
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			out, err := s.run(wctx, c, c.user, watchScript, dir, depth)
			if wctx.Err() != nil {
				return
			}
			w.mu.Lock()
			if err != nil {
				// The directory or the sandbox is gone: the error is
				// the watcher's last event, kept a while for a poller.
				w.err = err
				w.mu.Unlock()
				select {
				case w.notify <- struct{}{}:
				default:
				}
				time.AfterFunc(keepExited, func() { ws.stop(w.id) })
				return
			}
			cur := parseSnapshot(out)
			if evs := diff(prev, cur); len(evs) > 0 {
				w.events = append(w.events, evs...)
				if len(w.events) > 10000 {
					w.events = w.events[len(w.events)-10000:]
				}
				select {
				case w.notify <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
			prev = cur
		}
	}()
	return w, nil
}

// drain takes the events gathered so far.
func (w *watcher) drain() ([]*filesystem.FilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	return evs, w.err
}

func (ws *watchers) stop(id string) bool {
	ws.mu.Lock()
	w := ws.m[id]
	delete(ws.m, id)
	ws.mu.Unlock()
	if w != nil {
		w.cancel()
	}
	return w != nil
}

func (ws *watchers) get(sandbox, id string) *watcher {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w := ws.m[id]; w != nil && w.sandbox == sandbox {
		return w
	}
	return nil
}

func (ws *watchers) dropSandbox(id string) {
	ws.mu.Lock()
	var ids []string
	for wid, w := range ws.m {
		if w.sandbox == id {
			ids = append(ids, wid)
		}
	}
	ws.mu.Unlock()
	for _, wid := range ids {
		ws.stop(wid)
	}
}

func (ws *watchers) closeAll() {
	ws.mu.Lock()
	var ids []string
	for wid := range ws.m {
		ids = append(ids, wid)
	}
	ws.mu.Unlock()
	for _, wid := range ids {
		ws.stop(wid)
	}
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	c := callOf(ctx)
	dir, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return connectErr(err)
	}
	w, err := f.s.startWatch(ctx, c, dir, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer f.s.watch.stop(w.id)
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keep := time.NewTicker(defaultKeepalive)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the watch's timeout passed"))
			}
			return nil
		case <-keep.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-w.notify:
			evs, werr := w.drain()
			for _, ev := range evs {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			if werr != nil {
				return connectErr(werr)
			}
		}
	}
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	c := callOf(ctx)
	dir, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	w, err := f.s.startWatch(ctx, c, dir, req.Msg.GetRecursive())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: w.id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	c := callOf(ctx)
	w := f.s.watch.get(c.sb.ID, req.Msg.GetWatcherId())
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	evs, err := w.drain()
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	c := callOf(ctx)
	if f.s.watch.get(c.sb.ID, req.Msg.GetWatcherId()) == nil || !f.s.watch.stop(req.Msg.GetWatcherId()) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
