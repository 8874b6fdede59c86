package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestSnapshotRoutes: the snapshot endpoints' statuses and bodies, through
// raw requests and the Go client, and their errors.
func TestSnapshotRoutes(t *testing.T) {
	ts := newTestServer(t)
	ctx := context.Background()
	sb, err := ts.unix.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	resp := ts.request(t, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/snapshots", strings.NewReader(`{"name":"r1"}`), true)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("snapshot: status %d", resp.StatusCode)
	}
	var snap apitypes.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil || len(snap.ID) != 64 || snap.Name != "r1" || snap.SandboxID != sb.ID {
		t.Fatalf("snapshot body %+v %v", snap, err)
	}
	// Without a body too.
	if resp := ts.request(t, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/snapshots", nil, true); resp.StatusCode != http.StatusCreated {
		t.Errorf("snapshot without a body: status %d", resp.StatusCode)
	}
	l, err := ts.unix.Snapshots(ctx, sb.ID)
	if err != nil || len(l) != 1 || l[0].ID != snap.ID {
		t.Errorf("list: %+v %v", l, err)
	}
	if g, err := ts.tcp.GetSnapshot(ctx, snap.ID); err != nil || g.ID != snap.ID {
		t.Errorf("get: %+v %v", g, err)
	}
	if r, err := ts.unix.RestoreSandbox(ctx, sb.ID, snap.ID); err != nil || r.ID != sb.ID {
		t.Errorf("restore: %+v %v", r, err)
	}
	fork, err := ts.unix.CreateSandbox(ctx, apitypes.CreateSandboxRequest{FromSnapshot: snap.ID})
	if err != nil || fork.Language != "shell" {
		t.Errorf("fork: %+v %v", fork, err)
	}
	if resp := ts.request(t, http.MethodDelete, "/v1/snapshots/"+snap.ID, nil, true); resp.StatusCode != http.StatusNoContent {
		t.Errorf("delete: status %d", resp.StatusCode)
	}
	if err := ts.unix.DeleteSnapshot(ctx, snap.ID); !errdefs.Is(err, errdefs.NotFound) {
		t.Errorf("delete again: %v, want not_found", err)
	}

	zero := strings.Repeat("0", 64)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     errdefs.Code
		message                  string
	}{
		{"body mismatch", "POST", "/v1/sandboxes/sb-a/snapshots", `{"sandbox_id":"sb-b"}`, 400, errdefs.InvalidArgument, "sandbox_id"},
		{"unknown field", "POST", "/v1/sandboxes/" + sb.ID + "/snapshots", `{"nam":"x"}`, 400, errdefs.InvalidArgument, "nam"},
		{"bad name", "POST", "/v1/sandboxes/" + sb.ID + "/snapshots", `{"name":"a b"}`, 400, errdefs.InvalidArgument, "name:"},
		{"unknown sandbox", "POST", "/v1/sandboxes/sb-nope/snapshots", ``, 404, errdefs.NotFound, "sandbox_id"},
		{"restore without snapshot", "POST", "/v1/sandboxes/" + sb.ID + "/restore", `{}`, 400, errdefs.InvalidArgument, "snapshot_id: required"},
		{"restore unknown", "POST", "/v1/sandboxes/" + sb.ID + "/restore", `{"snapshot_id":"` + zero + `"}`, 404, errdefs.NotFound, "snapshot_id"},
		{"get malformed", "GET", "/v1/snapshots/xyz", ``, 400, errdefs.InvalidArgument, "snapshot_id"},
		{"get unknown", "GET", "/v1/snapshots/" + zero, ``, 404, errdefs.NotFound, "snapshot_id"},
		{"list bad sandbox", "GET", "/v1/snapshots?sandbox_id=a%20b", ``, 400, errdefs.InvalidArgument, "sandbox_id"},
		{"fork unknown", "POST", "/v1/sandboxes", `{"from_snapshot":"` + zero + `"}`, 404, errdefs.NotFound, "from_snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body *strings.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			var resp *http.Response
			if body != nil {
				resp = ts.request(t, tc.method, tc.path, body, true)
			} else {
				resp = ts.request(t, tc.method, tc.path, nil, true)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			e := decodeError(t, resp)
			if e.Code != string(tc.code) || !strings.Contains(e.Message, tc.message) {
				t.Errorf("error %+v, want code %s and a message with %q", e, tc.code, tc.message)
			}
		})
	}
}
