package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Template tools (group sandbox): template_create, template_list,
// template_get, template_delete. Using one is sandbox_create {template}.

func (s *srv) addTemplateTools() {
	addTool[apitypes.TemplateCreateRequest, apitypes.Template](s, "template_create", "Create a sandbox template",
		joinLines(
			"Create a template: an image plus an optional start command (a server, say) with its readiness check (ready.port that accepts a connection, or ready.command that exits 0), default limits, network and environment, and a warm pool size.",
			"sandbox_create {template} then returns a sandbox whose start command is already ready; with pool > 0 the daemon keeps that many ready, so a create takes milliseconds.",
		),
		annotations{},
		func(ctx context.Context, c *call, in *apitypes.TemplateCreateRequest) (*result, error) {
			t, err := s.e.CreateTemplate(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: t, text: fmt.Sprintf("template %s created (image %s, pool %d)", t.Name, t.Image, t.Pool)}, nil
		})
	addTool[struct{}, apitypes.TemplateList](s, "template_list", "List sandbox templates",
		"List templates: name, image, start command, readiness check, defaults, pool size and warm sandboxes waiting.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, _ *struct{}) (*result, error) {
			l, err := s.e.ListTemplates(ctx)
			if err != nil {
				return nil, err
			}
			lines := make([]string, 0, len(l.Templates))
			for _, t := range l.Templates {
				lines = append(lines, fmt.Sprintf("%s image %s pool %d warm %d", t.Name, t.Image, t.Pool, t.Warm))
			}
			text := fmt.Sprintf("%d templates", len(l.Templates))
			if len(lines) > 0 {
				text += ":\n" + strings.Join(lines, "\n")
			}
			return &result{structured: l, text: text}, nil
		})
	addTool[apitypes.TemplateRef, apitypes.Template](s, "template_get", "Describe a sandbox template",
		"Describe a template: its image, start command, readiness check and defaults, and how many ready sandboxes of it wait in its warm pool.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.TemplateRef) (*result, error) {
			t, err := s.e.GetTemplate(ctx, in.Name)
			if err != nil {
				return nil, err
			}
			return &result{structured: t, text: fmt.Sprintf("template %s: image %s, pool %d, warm %d", t.Name, t.Image, t.Pool, t.Warm)}, nil
		})
	addTool[apitypes.TemplateRef, apitypes.TemplateDeleteResult](s, "template_delete", "Delete a sandbox template",
		"Delete a template and end its warm sandboxes; sandboxes already made from it keep running.",
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.TemplateRef) (*result, error) {
			if err := s.e.DeleteTemplate(ctx, in.Name); err != nil {
				return nil, err
			}
			return &result{structured: apitypes.TemplateDeleteResult{Name: in.Name, Deleted: true}, text: "template " + in.Name + " deleted"}, nil
		})
}
