package webhooks

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// fixedResolver answers a few names without the network.
type fixedResolver map[string][]netip.Addr

func (r fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func newService(t testing.TB) *Service {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := config.Default().Webhooks
	cfg.MaxWebhooks = 1 << 20
	return New(Options{Store: st, Config: cfg, Resolver: fixedResolver{
		"hooks.example":   {netip.MustParseAddr("203.0.113.7")},
		"rebind.example":  {netip.MustParseAddr("203.0.113.8"), netip.MustParseAddr("10.0.0.1")},
		"metadata.intern": {netip.MustParseAddr("169.254.169.254")},
	}})
}

// The Standard Webhooks specification's own example signs to this value.
func TestSignSpecExample(t *testing.T) {
	sig, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if err != nil || sig != "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" {
		t.Fatalf("Sign = %q, %v", sig, err)
	}
}

// A tenant's URL at a restricted address is refused, whatever name
// leads there; the administrator's is accepted; the dialer refuses the
// same addresses at delivery time.
func TestAddressPolicy(t *testing.T) {
	s := newService(t)
	tenant := principal.With(context.Background(), principal.Principal{Tenant: "t", KeyName: "t"})
	for u, code := range map[string]errdefs.Code{
		"https://hooks.example/x":             "",
		"https://rebind.example/x":            errdefs.PermissionDenied,
		"http://metadata.intern/":             errdefs.PermissionDenied,
		"http://127.0.0.1:9/":                 errdefs.PermissionDenied,
		"http://[::ffff:127.0.0.1]/":          errdefs.PermissionDenied,
		"http://100.64.0.1/":                  errdefs.PermissionDenied,
		"http://[fe80::1]/":                   errdefs.PermissionDenied,
		"http://0.0.0.0/":                     errdefs.InvalidArgument,
		"http://224.0.0.1/":                   errdefs.InvalidArgument,
		"http://nowhere.example/":             errdefs.InvalidArgument,
		"gopher://hooks.example/":             errdefs.InvalidArgument,
		"http://hooks.example:99999/":         errdefs.InvalidArgument,
		"http://hooks.example/#frag":          errdefs.InvalidArgument,
		"http://bad_host!.example/":           errdefs.InvalidArgument,
		"http://hooks.example/a b":            errdefs.InvalidArgument,
		"https://u:p@hooks.example/":          errdefs.InvalidArgument,
		"/relative":                           errdefs.InvalidArgument,
		"http://" + strings.Repeat("a", 2100): errdefs.InvalidArgument,
	} {
		_, err := s.CreateWebhook(tenant, apitypes.WebhookCreateRequest{URL: u})
		if errdefs.CodeOf(err) != code && (code != "" || err != nil) {
			t.Errorf("%s: %v, want %s", u, err, code)
		}
		if err != nil && !strings.HasPrefix(errdefs.MessageOf(err), "url:") {
			t.Errorf("%s: %q does not name url", u, errdefs.MessageOf(err))
		}
	}
	if _, err := s.CreateWebhook(context.Background(), apitypes.WebhookCreateRequest{URL: "http://10.0.0.1/"}); err != nil {
		t.Errorf("admin at a private address: %v", err)
	}
	dial := s.dialer(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, addr := range []string{"127.0.0.1:1", "metadata.intern:80", "[::1]:1"} {
		if c, err := dial(ctx, "tcp", addr); err == nil || !strings.Contains(err.Error(), "webhooks.allow_private") {
			if c != nil {
				c.Close()
			}
			t.Errorf("dial %s as a tenant: %v", addr, err)
		}
	}
}

// Tenants see only their own hooks; another's is not_found.
func TestTenantIsolation(t *testing.T) {
	s := newService(t)
	a := principal.With(context.Background(), principal.Principal{Tenant: "a", KeyName: "a"})
	b := principal.With(context.Background(), principal.Principal{Tenant: "b", KeyName: "b"})
	h, err := s.CreateWebhook(a, apitypes.WebhookCreateRequest{URL: "https://hooks.example/a"})
	if err != nil || !strings.HasPrefix(h.Secret, "whsec_") {
		t.Fatal(h, err)
	}
	if l, err := s.ListWebhooks(b); err != nil || len(l.Webhooks) != 0 {
		t.Errorf("b's list: %+v %v", l, err)
	}
	if _, err := s.GetWebhook(b, h.ID); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("b get a's hook: %v", err)
	}
	if err := s.DeleteWebhook(b, h.ID); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("b delete a's hook: %v", err)
	}
	if g, err := s.GetWebhook(a, h.ID); err != nil || g.Secret != "" {
		t.Errorf("a get: %+v %v", g, err)
	}
	if l, err := s.ListWebhooks(context.Background()); err != nil || len(l.Webhooks) != 1 {
		t.Errorf("admin list: %+v %v", l, err)
	}
}

func TestBackoff(t *testing.T) {
	for n := 1; n <= 12; n++ {
		want := min(time.Second<<(n-1), time.Minute)
		for range 50 {
			if d := backoff(time.Second, time.Minute, n); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %s, want %s..%s", n, d, want/2, want)
			}
		}
	}
}

// FuzzCreateWebhook: whatever a caller sends, registration answers a
// webhook whose URL is a well-formed http(s) URL, or an error of the
// taxonomy that names the field; it never panics.
func FuzzCreateWebhook(f *testing.F) {
	f.Add("n", "https://hooks.example/x", "sandbox.lifecycle.created", 0)
	f.Add("", "http://127.0.0.1:8080/", "", 5000)
	f.Add("\x00", "http://[::1", "run.finished,run.finished", 1)
	f.Add("x", "https://hooks.example:0/", "nope", 99999)
	s := newService(f)
	ctx := principal.With(context.Background(), principal.Principal{Tenant: "t", KeyName: "t"})
	f.Fuzz(func(t *testing.T, name, u, events string, timeout int) {
		var ev []string
		if events != "" {
			ev = strings.Split(events, ",")
		}
		h, err := s.CreateWebhook(ctx, apitypes.WebhookCreateRequest{Name: name, URL: u, Events: ev, TimeoutMS: timeout})
		if err != nil {
			code, msg := errdefs.CodeOf(err), errdefs.MessageOf(err)
			if code != errdefs.InvalidArgument && code != errdefs.PermissionDenied {
				t.Fatalf("%q: code %s: %v", u, code, err)
			}
			named := false
			for _, f := range []string{"name:", "url:", "events", "timeout_ms:"} {
				named = named || strings.HasPrefix(msg, f)
			}
			if !named {
				t.Fatalf("error names no field: %q", msg)
			}
			return
		}
		p, perr := url.Parse(h.URL)
		if perr != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" || p.User != nil {
			t.Fatalf("accepted %q as %q", u, h.URL)
		}
		if h.TimeoutMS < 1000 || h.TimeoutMS > 30000 {
			t.Fatalf("timeout %d accepted", h.TimeoutMS)
		}
	})
}
