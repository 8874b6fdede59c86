package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Named volume tools (group sandbox): volume_create, volume_list,
// volume_get, volume_delete. Mounting is sandbox_create {volumes}.

type volumeListOut = apitypes.VolumeList

type volumeDeleteOut = apitypes.VolumeDeleteResult

func (s *srv) addVolumeTools() {
	addTool[apitypes.VolumeCreateRequest, apitypes.Volume](s, "volume_create", "Create a named volume",
		joinLines(
			"Create a named volume: disk with its own size limit that outlives sandboxes (a daemon restart too).",
			"Mount it with sandbox_create {volumes: [{name, path, read_only}]}; several sandboxes may mount it at once and see each other's writes at once. A full volume is ENOSPC. Snapshots of a sandbox do not include its volumes.",
		),
		annotations{},
		func(ctx context.Context, c *call, in *apitypes.VolumeCreateRequest) (*result, error) {
			v, err := s.e.CreateVolume(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: v, text: fmt.Sprintf("volume %s created: %d MiB, %d inodes", v.Name, v.SizeBytes>>20, v.Inodes)}, nil
		})
	addTool[struct{}, volumeListOut](s, "volume_list", "List named volumes",
		"List named volumes: name, size, used bytes and the live sandboxes that mount each (used_by).",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, _ *struct{}) (*result, error) {
			l, err := s.e.ListVolumes(ctx)
			if err != nil {
				return nil, err
			}
			lines := make([]string, 0, len(l.Volumes))
			for _, v := range l.Volumes {
				lines = append(lines, fmt.Sprintf("%s %d/%d MiB used by [%s]", v.Name, v.UsedBytes>>20, v.SizeBytes>>20, strings.Join(v.UsedBy, " ")))
			}
			text := fmt.Sprintf("%d volumes", len(l.Volumes))
			if len(lines) > 0 {
				text += ":\n" + strings.Join(lines, "\n")
			}
			return &result{structured: l, text: text}, nil
		})
	addTool[apitypes.VolumeRef, apitypes.Volume](s, "volume_get", "Describe a named volume",
		"Describe a named volume: size and inode limits, what is used, its tenant and the live sandboxes that mount it (used_by).",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.VolumeRef) (*result, error) {
			v, err := s.e.GetVolume(ctx, in.Name)
			if err != nil {
				return nil, err
			}
			return &result{structured: v, text: fmt.Sprintf("volume %s: %d of %d MiB used, mounted by [%s]", v.Name, v.UsedBytes>>20, v.SizeBytes>>20, strings.Join(v.UsedBy, " "))}, nil
		})
	addTool[apitypes.VolumeRef, volumeDeleteOut](s, "volume_delete", "Delete a named volume",
		"Delete a named volume and every file on it. Refused (failed_precondition, naming them) while live sandboxes mount it: terminate them first.",
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.VolumeRef) (*result, error) {
			if err := s.e.DeleteVolume(ctx, in.Name); err != nil {
				return nil, err
			}
			return &result{structured: volumeDeleteOut{Name: in.Name, Deleted: true}, text: "volume " + in.Name + " deleted"}, nil
		})
}
