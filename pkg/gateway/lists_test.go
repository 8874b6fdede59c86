package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// TestMergedLists: GET /v1/runs and /v1/snapshots through a gateway list
// every node's records, as the caller, newest first, cut to the limit
// asked for; a node that does not answer is left out; a node's refusal of
// the request (a bad filter) is the caller's answer; the snapshots of one
// sandbox come from its node only.
func TestMergedLists(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	node := func(name string, offsets ...int) (*httptest.Server, *[]string) {
		var seen []string
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = append(seen, r.Method+" "+r.URL.RequestURI()+" as "+r.Header.Get("X-Sandboxd-Principal"))
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Query().Get("limit") == "-1" {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: "invalid_argument", Message: "limit: must be positive"}})
				return
			}
			switch r.URL.Path {
			case "/v1/runs":
				l := apitypes.RunList{}
				for _, o := range offsets {
					l.Runs = append(l.Runs, apitypes.RunMetadata{RunID: name + "-run", StartTime: t0.Add(time.Duration(o) * time.Minute)})
				}
				_ = json.NewEncoder(w).Encode(l)
			case "/v1/snapshots":
				var l struct {
					Snapshots []apitypes.Snapshot `json:"snapshots"`
				}
				for _, o := range offsets {
					l.Snapshots = append(l.Snapshots, apitypes.Snapshot{ID: name + "-snap", CreatedAt: t0.Add(time.Duration(o) * time.Minute)})
				}
				_ = json.NewEncoder(w).Encode(l)
			}
		})
		return httptest.NewServer(h), &seen
	}
	a, seenA := node("a", 1, 5)
	defer a.Close()
	b, seenB := node("b", 3)
	defer b.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // refuses connections
	g := New(Options{Discovery: Static{{Name: "a", URL: a.URL}, {Name: "b", URL: b.URL}, {Name: "gone", URL: gone.URL}}, Auth: keyAuth{}, Secret: "s"})
	gs := httptest.NewServer(g)
	defer gs.Close()
	get := func(path string, out any) int {
		req, _ := http.NewRequest("GET", gs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer user-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if out != nil {
			_ = json.NewDecoder(res.Body).Decode(out)
		}
		return res.StatusCode
	}

	var runs apitypes.RunList
	if code := get("/v1/runs", &runs); code != http.StatusOK || len(runs.Runs) != 2 || runs.Runs[0].RunID != "a-run" || runs.Runs[1].RunID != "b-run" || !runs.Truncated {
		// No limit: the longest node's page (2), newest first (a +5, b +3), cut.
		t.Fatalf("runs: %d %+v", code, runs)
	}
	runs = apitypes.RunList{}
	if code := get("/v1/runs?limit=10", &runs); code != http.StatusOK || len(runs.Runs) != 3 || runs.Truncated ||
		!runs.Runs[0].StartTime.After(runs.Runs[1].StartTime) || !runs.Runs[1].StartTime.After(runs.Runs[2].StartTime) {
		t.Fatalf("runs?limit=10: %d %+v", code, runs)
	}
	var e apitypes.ErrorResponse
	if code := get("/v1/runs?limit=-1", &e); code != http.StatusBadRequest || e.Error.Code != "invalid_argument" || e.Error.Message != "limit: must be positive" {
		t.Errorf("a node's refusal: %d %+v", code, e)
	}
	var snaps struct {
		Snapshots []apitypes.Snapshot `json:"snapshots"`
	}
	if code := get("/v1/snapshots", &snaps); code != http.StatusOK || len(snaps.Snapshots) != 3 || snaps.Snapshots[0].ID != "a-snap" || snaps.Snapshots[1].ID != "b-snap" {
		t.Fatalf("snapshots: %d %+v", code, snaps)
	}
	for _, seen := range []*[]string{seenA, seenB} {
		for _, s := range *seen {
			if want := `"tenant":"u"`; !strings.Contains(s, want) {
				t.Errorf("a node was asked %s, not as the caller", s)
			}
		}
	}
	// One sandbox's snapshots: its node only.
	nA, nB := len(*seenA), len(*seenB)
	id := "sb-" + sandbox.NodeTag("b") + "0123456789ab"
	if code := get("/v1/snapshots?sandbox_id="+id, nil); code != http.StatusOK {
		t.Errorf("snapshots of %s: %d", id, code)
	}
	if len(*seenA) != nA || len(*seenB) != nB+1 {
		t.Errorf("snapshots of a node-b sandbox reached a %d and b %d times, want b once", len(*seenA)-nA, len(*seenB)-nB)
	}
}
