package mcpserver

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Long work as MCP tasks (docs/SPEC.md "Tasks"). mcp-go carries the tasks
// of protocol revision 2025-11-25 — a tools/call with params.task answered
// by a task handle, then tasks/get, tasks/result, tasks/list and
// tasks/cancel — which is what the official TypeScript SDK's task client
// (client.experimental.tasks) speaks. We use that and add what a sandbox
// daemon needs on top:
//
//   - The work outlives the POST that started it. mcp-go runs a task's
//     handler under the request's context, and net/http ends that context
//     as soon as the task handle is written; the handler therefore runs
//     detached (detachTask), ended only by tasks/cancel or its TTL. A client
//     that drops its connection and comes back on the same session
//     (Mcp-Session-Id) finds the task and its result.
//   - Every task has a bounded lifetime: mcp-go keeps a task without a TTL
//     forever, so a TTL is always set, at most taskMaxTTL.
//
// Tools without task support, and clients that do not send params.task,
// get today's behaviour: progress and heartbeats on the call's own stream,
// background: true with job_status.

// taskTools are the tools that may run as tasks: the long ones.
var taskTools = map[string]bool{
	"run_code": true, "exec_command": true, "run_task": true, "packages_install": true,
	"autofix": true, "agent_run": true, "image_build": true, "image_build_dockerfile": true, "image_pull": true, "sandbox_create": true, "vm_test": true,
}

const (
	// taskDefaultTTL is how long a task and its result are kept when the
	// client names no TTL; taskMaxTTL caps what it may name. The work is
	// stopped at the TTL too: nobody could fetch its result after it.
	taskDefaultTTL = time.Hour
	taskMaxTTL     = 24 * time.Hour
)

// taskSlot carries the id mcp-go gives a task from its creation hook, which
// runs in the POST's goroutine, to the handler, which mcp-go starts after
// it (the go statement orders the write before the read). One per POST:
// a POST carries one JSON-RPC request.
type taskSlot struct{ id string }

type taskSlotKey struct{}

// withTaskSlots gives every request its taskSlot.
func withTaskSlots(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), taskSlotKey{}, &taskSlot{})))
	})
}

// taskRuns are the detached contexts of running tasks, by task id, so that
// tasks/cancel reaches work that no longer hangs off a request.
type taskRuns struct {
	mu      sync.Mutex
	cancels map[string]context.CancelFunc
	// early are tasks cancelled before their handler registered (a client
	// may cancel at once); bounded by the cancels that raced.
	early map[string]bool
}

func newTaskRuns() *taskRuns {
	return &taskRuns{cancels: map[string]context.CancelFunc{}, early: map[string]bool{}}
}

func (t *taskRuns) add(id string, cancel context.CancelFunc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.early[id] {
		delete(t.early, id)
		cancel()
		return
	}
	t.cancels[id] = cancel
}

func (t *taskRuns) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.cancels, id)
}

func (t *taskRuns) cancel(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.cancels[id]; ok {
		c()
		delete(t.cancels, id)
		return
	}
	t.early[id] = true
}

// taskHooks connect mcp-go's task lifecycle to taskRuns.
func (s *srv) taskHooks() *server.TaskHooks {
	h := &server.TaskHooks{}
	h.AddOnTaskCreated(func(ctx context.Context, m server.TaskMetrics) {
		if slot, _ := ctx.Value(taskSlotKey{}).(*taskSlot); slot != nil {
			slot.id = m.TaskID
		}
	})
	h.AddOnTaskCancelled(func(ctx context.Context, m server.TaskMetrics) {
		s.tasks.cancel(m.TaskID)
	})
	return h
}

// boundTaskTTL sets a task-augmented call's TTL: taskDefaultTTL when the
// client named none, at most taskMaxTTL. It runs before mcp-go creates the
// task (a before-call hook), so the task handle states the TTL it got.
func boundTaskTTL(_ context.Context, _ any, req *mcp.CallToolRequest) {
	if req.Params.Task == nil {
		return
	}
	ttl := taskDefaultTTL.Milliseconds()
	if t := req.Params.Task.TTL; t != nil && *t > 0 {
		ttl = min(*t, taskMaxTTL.Milliseconds())
	}
	req.Params.Task.TTL = &ttl
}

// detachTask returns the context a task's work runs under: the request's
// values (session, principal) without its end, ended by tasks/cancel or the
// task's TTL. done must be called when the work returns. Outside a task,
// or where no task id reached the slot (a server used without NewHandler),
// it is ctx itself.
func (s *srv) detachTask(ctx context.Context, req mcp.CallToolRequest) (context.Context, func()) {
	slot, _ := ctx.Value(taskSlotKey{}).(*taskSlot)
	if req.Params.Task == nil || slot == nil || slot.id == "" {
		return ctx, func() {}
	}
	ttl := taskDefaultTTL
	if t := req.Params.Task.TTL; t != nil && *t > 0 {
		ttl = time.Duration(*t) * time.Millisecond
	}
	id := slot.id
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
	s.tasks.add(id, cancel)
	return work, func() { s.tasks.remove(id); cancel() }
}
