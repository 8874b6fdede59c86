package sandbox

import (
	"context"
	"io"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Commands and files of a sandbox reached through a guest agent of its own
// (GuestOps: a VM booting an administrator's disk). Each is a command of
// the sandbox like one through our agent: it is running meanwhile and the
// idle timeout counts it.

// guestOps is sb's handle as GuestOps; Capabilities.GuestAgent promises it.
func (sb *Sandbox) guestOps() (GuestOps, error) {
	sb.mu.Lock()
	h := sb.handle
	sb.mu.Unlock()
	g, ok := h.(GuestOps)
	if !ok {
		return nil, errdefs.New(errdefs.Internal, "sandbox %s: its handle claims a guest agent but has no guest operations", sb.ID)
	}
	return g, nil
}

// guestExec runs spec through sb's guest agent, inside the caller's
// beginCommand/endCommand. onOutput sees the output once it has ended.
func (m *Manager) guestExec(ctx context.Context, sb *Sandbox, spec ExecSpec, onOutput OutputFunc) (*ExecResult, error) {
	g, err := sb.guestOps()
	if err != nil {
		return nil, err
	}
	limit := spec.MaxResultBytes
	if limit <= 0 || (m.opt.OutputLimit > 0 && limit > m.opt.OutputLimit) {
		limit = m.opt.OutputLimit
	}
	sb.mu.Lock()
	env := MergeEnv(sb.spec.Env, spec.Env)
	sb.mu.Unlock()
	res, err := g.GuestExec(ctx, spec, env, limit)
	if err != nil {
		return nil, err
	}
	if onOutput != nil {
		for _, o := range []struct{ stream, data string }{{"stdout", res.Stdout}, {"stderr", res.Stderr}} {
			if o.data != "" {
				onOutput(o.stream, []byte(o.data))
			}
		}
	}
	return res, nil
}

// guestReadFile reads a file through sb's guest agent.
func (m *Manager) guestReadFile(ctx context.Context, sb *Sandbox, path string, offset, max int64) (*agent.FileData, error) {
	g, err := sb.guestOps()
	if err != nil {
		return nil, err
	}
	if err := m.beginCommand(ctx, sb); err != nil {
		return nil, err
	}
	defer m.endCommand(sb)
	return g.GuestReadFile(ctx, path, offset, max)
}

// guestWriteFile writes a file through sb's guest agent: the whole content
// at once (guest-file-write has no append, and the engine caps the size).
func (m *Manager) guestWriteFile(ctx context.Context, sb *Sandbox, req agent.WriteFileRequest, content io.Reader) (*agent.FileInfo, error) {
	g, err := sb.guestOps()
	if err != nil {
		return nil, err
	}
	if req.Append {
		caps, _ := m.capsOf(sb)
		return nil, errdefs.Unavailablef("append: sandbox %s writes files through its guest agent, which cannot append (it has: %v)", sb.ID, caps.List())
	}
	data, err := io.ReadAll(io.LimitReader(content, req.Size+1))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "content: read the upload")
	}
	if int64(len(data)) != req.Size {
		return nil, errdefs.Invalidf("content: %d bytes, not the %d announced", len(data), req.Size)
	}
	if err := m.beginCommand(ctx, sb); err != nil {
		return nil, err
	}
	defer m.endCommand(sb)
	n, err := g.GuestWriteFile(ctx, req.Path, req.Mode, data)
	if err != nil {
		return nil, err
	}
	return &agent.FileInfo{Path: req.Path, Size: n}, nil
}

// capsOf is sb's handle's capabilities.
func (m *Manager) capsOf(sb *Sandbox) (Capabilities, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.handle == nil {
		return Capabilities{}, errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	return sb.handle.Capabilities(), nil
}

// GuestCheckPath checks path for live sandbox id: through its guest agent's
// rules when it has no agent of ours (ok true), else ok false and the
// caller checks it as a path of our agent.
func (m *Manager) GuestCheckPath(ctx context.Context, id, field, path string) (ok bool, err error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return false, nil // the operation itself reports it
	}
	caps, err := m.capsOf(sb)
	if err != nil || caps.Agent || !caps.GuestAgent {
		return false, nil
	}
	g, err := sb.guestOps()
	if err != nil {
		return true, err
	}
	return true, g.GuestCheckPath(field, path)
}
