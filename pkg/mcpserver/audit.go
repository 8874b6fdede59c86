package mcpserver

import (
	"context"
	"reflect"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// auditTool records a call of a tool that changes anything (not read-only)
// in the audit log, before its result goes back to the client. Every MCP
// message is a POST to /mcp, so the REST layer cannot tell a list from an
// exec: this is where MCP calls are recorded. The caller is the principal
// the HTTP layer put on the context; none means the in-process stdio
// server (the local administrator).
func (s *srv) auditTool(ctx context.Context, tool string, a annotations, in, out any, err error) {
	if s.opt.Audit == nil || a.readOnly {
		return
	}
	p, ok := principal.From(ctx)
	o := principal.OriginFrom(ctx)
	if !ok {
		p = principal.Principal{KeyName: "stdio", Admin: true}
		o = principal.Origin{FrontEnd: "stdio", Source: "stdio"}
	}
	rec := audit.Record{
		KeyID: p.KeyID, KeyName: p.KeyName, Tenant: p.Tenant, Admin: p.Admin,
		FrontEnd: "mcp", Source: o.Source, Action: "mcp:" + tool, Target: targetOf(in), Outcome: audit.Success,
	}
	if o.FrontEnd == "stdio" {
		rec.FrontEnd = "stdio"
	}
	if rec.Target == "" {
		rec.Target = targetOf(out)
	}
	if err != nil {
		rec.Outcome, rec.Code = audit.Failure, string(errdefs.CodeOf(err))
	}
	_ = s.opt.Audit.Append(rec) // a failure is logged and counted by the log
}

// targetFields are the argument and result fields that name what a tool
// acted on, most specific first.
var targetFields = []string{"sandbox_id", "vm_id", "session_id", "image", "language"}

// targetOf finds the first of targetFields in v (a tool's input struct or
// its structured result).
func targetOf(v any) string {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return ""
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return ""
	}
	for _, want := range targetFields {
		if s := fieldByTag(rv, want); s != "" {
			return s
		}
	}
	return ""
}

func fieldByTag(rv reflect.Value, tag string) string {
	t := rv.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		fv := rv.Field(i)
		if f.Anonymous && fv.Kind() == reflect.Struct {
			if s := fieldByTag(fv, tag); s != "" {
				return s
			}
			continue
		}
		if name == tag && fv.Kind() == reflect.String {
			return fv.String()
		}
	}
	return ""
}
