package vm

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Pause stops the guest's vCPUs (QMP stop): it keeps its memory and devices
// but runs nothing until Resume. Pausing a paused VM does nothing.
func (v *VM) Pause(ctx context.Context) error {
	if _, err := v.mon.run(ctx, "stop", nil); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "vm %s: pause", v.rec.ID)
	}
	return nil
}

// Resume starts the vCPUs of a paused VM again (QMP cont). Resuming a
// running VM does nothing.
func (v *VM) Resume(ctx context.Context) error {
	if _, err := v.mon.run(ctx, "cont", nil); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "vm %s: resume", v.rec.ID)
	}
	return nil
}

// Paused reports whether the VM's vCPUs are stopped by Pause.
func (v *VM) Paused(ctx context.Context) (bool, error) {
	st, err := v.Status(ctx)
	return st == "paused", err
}
