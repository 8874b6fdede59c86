package mcpserver

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/webhooks"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The webhook tools over the real service and a real SQLite store: the
// secret once, the list without it, bad input refused naming the field,
// an unknown hook not_found, delete.
func TestWebhookTools(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := webhooks.New(webhooks.Options{Store: st, Config: config.Default().Webhooks})
	c := newClient(t, newFake(), Options{Webhooks: svc})

	h := ok[apitypes.Webhook](c, "webhook_create", map[string]any{"url": "http://192.0.2.10/hook", "events": []string{"run.finished"}})
	if !strings.HasPrefix(h.Secret, "whsec_") || h.State != "enabled" || h.TimeoutMS != 10000 {
		t.Fatalf("webhook_create: %+v", h)
	}
	l := ok[apitypes.WebhookList](c, "webhook_list", map[string]any{})
	if len(l.Webhooks) != 1 || l.Webhooks[0].Secret != "" {
		t.Fatalf("webhook_list: %+v", l)
	}
	off := ok[apitypes.Webhook](c, "webhook_update", map[string]any{"webhook_id": h.ID, "enabled": false})
	if off.State != "disabled" || off.DisabledReason == "" {
		t.Fatalf("webhook_update: %+v", off)
	}
	for _, tc := range []struct {
		tool       string
		args       map[string]any
		code, text string
	}{
		{"webhook_create", map[string]any{"url": "file:///etc/passwd"}, "invalid_argument", "url"},
		{"webhook_create", map[string]any{"url": "http://192.0.2.10/", "timeout_ms": 31000}, "invalid_argument", "timeout_ms"},
		{"webhook_create", map[string]any{"url": "http://192.0.2.10/", "events": []string{"x"}}, "invalid_argument", "events[0]"},
		{"webhook_get", map[string]any{"webhook_id": "wh_nope"}, "not_found", "webhook_id"},
		{"webhook_deliveries", map[string]any{"webhook_id": h.ID, "limit": 501}, "invalid_argument", "limit"},
		{"webhook_redeliver", map[string]any{"webhook_id": h.ID, "delivery_id": "msg_nope"}, "not_found", "delivery_id"},
	} {
		code, msg := errCode(t, c.call(tc.tool, tc.args, nil))
		if code != tc.code || !strings.Contains(msg, tc.text) {
			t.Errorf("%s %v: %s %q, want %s naming %s", tc.tool, tc.args, code, msg, tc.code, tc.text)
		}
	}
	if d := ok[webhookDeleteOut](c, "webhook_delete", map[string]any{"webhook_id": h.ID}); !d.Deleted {
		t.Fatalf("webhook_delete: %+v", d)
	}
	if l := ok[apitypes.WebhookList](c, "webhook_list", map[string]any{}); len(l.Webhooks) != 0 {
		t.Fatalf("after delete: %+v", l)
	}
}
