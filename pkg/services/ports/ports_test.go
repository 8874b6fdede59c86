package ports

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// fakeSandboxes stands for the sandbox service: the states of a few
// sandboxes, no containers (the service runs as any user).
type fakeSandboxes struct {
	states map[string]sandbox.State
	dialed []int
}

func (f *fakeSandboxes) Get(_ context.Context, id string) (*sandbox.Info, error) {
	st, ok := f.states[id]
	if !ok {
		return nil, errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
	}
	return &sandbox.Info{ID: id, State: st}, nil
}

func (f *fakeSandboxes) Require(context.Context, string, sandbox.Capability) error { return nil }

func (f *fakeSandboxes) DialPort(_ context.Context, _ string, port int) (net.Conn, error) {
	f.dialed = append(f.dialed, port)
	a, b := net.Pipe()
	_ = b.Close()
	return a, nil
}

func newService(t *testing.T) (*Service, *fakeSandboxes, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	sb := &fakeSandboxes{states: map[string]sandbox.State{"sb1": sandbox.StateReady, "gone": sandbox.StateTerminated}}
	return New(sb, st, slog.New(slog.NewTextHandler(io.Discard, nil))), sb, st
}

func TestExposeAuthorizeDialUnexpose(t *testing.T) {
	ctx := context.Background()
	s, sb, st := newService(t)
	if _, err := s.Expose(ctx, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080}); errdefs.CodeOf(err) != errdefs.Unavailable {
		t.Fatalf("expose before the listener: got %v, want unavailable", err)
	}
	s.SetPreviewURL("http://127.0.0.1:7000")
	x, err := s.Expose(ctx, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(x.BaseURL, "http://127.0.0.1:7000/preview/sb1/8080/") || x.Token == "" || x.HostURL == "" {
		t.Fatalf("exposure %+v: want base URL under the listener, a token and a host URL on the loopback", x)
	}
	again, err := s.Expose(ctx, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080})
	if err != nil || again.Token != x.Token {
		t.Fatalf("exposing again: %v, token %q, want the existing %q", err, again.Token, x.Token)
	}
	rows, err := st.ListPortExposures(ctx)
	if err != nil || len(rows) != 1 || rows[0].Token != x.Token {
		t.Fatalf("stored exposures %+v, %v: want the one row", rows, err)
	}
	if err := s.Authorize("sb1", 8080, "wrong"); errdefs.CodeOf(err) != errdefs.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	if err := s.Authorize("sb1", 8080, x.Token); err != nil {
		t.Fatalf("right token: %v", err)
	}
	c, err := s.Dial(ctx, "sb1", 8080)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := s.Dial(ctx, "sb1", 9090); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("dial of an unexposed port: %v", err)
	}
	if len(sb.dialed) != 1 || sb.dialed[0] != 8080 {
		t.Fatalf("dialed %v, want [8080]", sb.dialed)
	}
	list, err := s.List(ctx, "sb1")
	if err != nil || len(list) != 1 || list[0].Port != 8080 {
		t.Fatalf("list %+v, %v", list, err)
	}
	if err := s.Unexpose(ctx, "sb1", 8080); err != nil {
		t.Fatal(err)
	}
	if err := s.Authorize("sb1", 8080, x.Token); err == nil {
		t.Fatal("token still works after unexpose")
	}
	if err := s.Unexpose(ctx, "sb1", 8080); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("unexposing twice: %v", err)
	}
}

func TestExposeRefusesHostileInput(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t)
	s.SetPreviewURL("http://127.0.0.1:7000")
	for _, tc := range []struct {
		req   apitypes.ExposePortRequest
		code  errdefs.Code
		field string
	}{
		{apitypes.ExposePortRequest{SandboxID: "", Port: 80}, errdefs.InvalidArgument, "sandbox_id"},
		{apitypes.ExposePortRequest{SandboxID: "../etc", Port: 80}, errdefs.InvalidArgument, "sandbox_id"},
		{apitypes.ExposePortRequest{SandboxID: strings.Repeat("a", 65), Port: 80}, errdefs.InvalidArgument, "sandbox_id"},
		{apitypes.ExposePortRequest{SandboxID: "sb1", Port: 0}, errdefs.InvalidArgument, "port"},
		{apitypes.ExposePortRequest{SandboxID: "sb1", Port: 65536}, errdefs.InvalidArgument, "port"},
		{apitypes.ExposePortRequest{SandboxID: "nosuch", Port: 80}, errdefs.NotFound, "sandbox_id"},
		{apitypes.ExposePortRequest{SandboxID: "gone", Port: 80}, errdefs.Conflict, "sandbox_id"},
	} {
		_, err := s.Expose(ctx, tc.req)
		if errdefs.CodeOf(err) != tc.code || err == nil || !strings.Contains(err.Error(), " "+tc.field+":") {
			t.Errorf("expose %+v: got %v, want %s naming %s", tc.req, err, tc.code, tc.field)
		}
	}
}

func TestEndAndLoad(t *testing.T) {
	ctx := context.Background()
	s, sb, st := newService(t)
	s.SetPreviewURL("http://127.0.0.1:7000")
	x, err := s.Expose(ctx, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 3000})
	if err != nil {
		t.Fatal(err)
	}
	// A restarted daemon's table: the row of the live sandbox comes back,
	// a row of an ended one goes.
	if err := st.PutPortExposure(ctx, store.PortExposure{SandboxID: "gone", Port: 1, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	s2 := New(sb, st, s.log)
	s2.SetPreviewURL("http://127.0.0.1:7000")
	if err := s2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Authorize("sb1", 3000, x.Token); err != nil {
		t.Fatalf("restored exposure: %v", err)
	}
	rows, _ := st.ListPortExposures(ctx)
	if len(rows) != 1 || rows[0].SandboxID != "sb1" {
		t.Fatalf("rows after load %+v: want only sb1's", rows)
	}
	if !Ends(sandbox.StateTerminated) || !Ends(sandbox.StateFailed) || Ends(sandbox.StatePaused) {
		t.Fatal("Ends: only terminated and failed end exposures")
	}
	s2.End("sb1")
	if err := s2.Authorize("sb1", 3000, x.Token); err == nil {
		t.Fatal("token works after the sandbox ended")
	}
	if l, err := s2.List(ctx, "sb1"); err != nil || len(l) != 0 {
		t.Fatalf("list after end: %+v, %v: want none", l, err)
	}
}

// TestExposureTiedToKey: an exposure made with an API key stops
// authorizing requests once that key no longer authenticates — after a
// restart too (the key is stored with it) — with the answer of a wrong
// token; exposing the port again makes a new exposure for the caller's
// key, and the old token stays dead.
func TestExposureTiedToKey(t *testing.T) {
	s, sb, st := newService(t)
	s.SetPreviewURL("http://127.0.0.1:7000")
	revoked := map[string]bool{}
	valid := func(id string) bool { return !revoked[id] }
	s.SetKeyCheck(valid)
	alice := principal.With(context.Background(), principal.Principal{KeyID: "key-alice", KeyName: "alice", Tenant: "alice"})
	admin := principal.With(context.Background(), principal.Principal{KeyID: "key-admin", KeyName: "ops", Tenant: "ops", Admin: true})
	x, err := s.Expose(alice, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := st.ListPortExposures(context.Background())
	if len(rows) != 1 || rows[0].KeyID != "key-alice" {
		t.Fatalf("stored %+v: want the exposure with alice's key", rows)
	}
	if err := s.Authorize("sb1", 8080, x.Token); err != nil {
		t.Fatalf("before revocation: %v", err)
	}
	wrong := s.Authorize("sb1", 8080, "wrong")
	revoked["key-alice"] = true
	err = s.Authorize("sb1", 8080, x.Token)
	if errdefs.CodeOf(err) != errdefs.Unauthenticated || err.Error() != wrong.Error() {
		t.Fatalf("after revocation: %v, want %v", err, wrong)
	}
	// A restarted daemon keeps the tie.
	s2 := New(sb, st, s.log)
	s2.SetPreviewURL("http://127.0.0.1:7000")
	s2.SetKeyCheck(valid)
	if err := s2.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s2.Authorize("sb1", 8080, x.Token); errdefs.CodeOf(err) != errdefs.Unauthenticated {
		t.Fatalf("after restart, revoked key's exposure: %v", err)
	}
	y, err := s2.Expose(admin, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080})
	if err != nil || y.Token == x.Token {
		t.Fatalf("exposing again after revocation: %v, token reused %v", err, y != nil && y.Token == x.Token)
	}
	if err := s2.Authorize("sb1", 8080, y.Token); err != nil {
		t.Fatalf("the new exposure: %v", err)
	}
	if err := s2.Authorize("sb1", 8080, x.Token); err == nil {
		t.Fatal("the revoked key's token works again")
	}
	rows, _ = st.ListPortExposures(context.Background())
	if len(rows) != 1 || rows[0].KeyID != "key-admin" || rows[0].Token != y.Token {
		t.Fatalf("stored %+v: want one exposure, the admin's", rows)
	}
}

// TestExposureByGatewayKey: an exposure made through a gateway with a
// fleet key this node does not hold is tied to no key (tied, it would
// read as revoked at once); a gateway-forwarded key the node does hold
// stays tied to it; a direct caller's unknown key is never untied.
func TestExposureByGatewayKey(t *testing.T) {
	s, _, st := newService(t)
	s.SetPreviewURL("http://127.0.0.1:7000")
	held := map[string]bool{"key-local": true, "": true} // "" as tenants.Valid: the socket's
	s.SetKeyCheck(func(id string) bool { return held[id] })
	viaGateway := func(keyID string) context.Context {
		ctx := principal.With(context.Background(), principal.Principal{KeyID: keyID, KeyName: "k", Tenant: "t"})
		return principal.WithOrigin(ctx, principal.Origin{FrontEnd: "gateway", Source: "198.19.1.1:5000"})
	}
	x, err := s.Expose(viaGateway("key-fleet"), apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Authorize("sb1", 8080, x.Token); err != nil {
		t.Fatalf("an exposure made through a gateway with a fleet key: %v", err)
	}
	if _, err := s.Expose(viaGateway("key-local"), apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8081}); err != nil {
		t.Fatal(err)
	}
	direct := principal.WithOrigin(principal.With(context.Background(), principal.Principal{KeyID: "key-gone", Tenant: "t"}), principal.Origin{FrontEnd: "rest"})
	z, err := s.Expose(direct, apitypes.ExposePortRequest{SandboxID: "sb1", Port: 8082})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Authorize("sb1", 8082, z.Token); errdefs.CodeOf(err) != errdefs.Unauthenticated {
		t.Errorf("a direct caller's unknown key's exposure: %v, want unauthenticated", err)
	}
	rows, _ := st.ListPortExposures(context.Background())
	keys := map[int]string{}
	for _, r := range rows {
		keys[r.Port] = r.KeyID
	}
	if keys[8080] != "" || keys[8081] != "key-local" || keys[8082] != "key-gone" {
		t.Errorf("stored keys by port: %v", keys)
	}
}
