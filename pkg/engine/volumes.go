package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Named volumes are the volume service's (pkg/services/volumes); these
// methods keep the engine the one facade the front ends' narrow
// interfaces are satisfied by.

// CreateVolume makes a named volume.
func (e *Engine) CreateVolume(ctx context.Context, req apitypes.VolumeCreateRequest) (*apitypes.Volume, error) {
	return e.volumes.Create(ctx, req)
}

// ListVolumes lists the volumes the caller may see.
func (e *Engine) ListVolumes(ctx context.Context) (*apitypes.VolumeList, error) {
	return e.volumes.List(ctx)
}

// GetVolume describes volume name.
func (e *Engine) GetVolume(ctx context.Context, name string) (*apitypes.Volume, error) {
	return e.volumes.Get(ctx, name)
}

// DeleteVolume removes volume name and its files; refused while a live
// sandbox mounts it.
func (e *Engine) DeleteVolume(ctx context.Context, name string) error {
	return e.volumes.Delete(ctx, name)
}
