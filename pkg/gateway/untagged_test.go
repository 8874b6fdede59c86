package gateway

import (
	"net/http"
	"testing"
)

// TestUntaggedRoute: requests about a snapshot, run or autofix loop by id
// go to the node that holds the id, probed by a HEAD of the id's own path;
// other requests under those prefixes are not routed that way.
func TestUntaggedRoute(t *testing.T) {
	for _, c := range []struct {
		method, path, probe string
		ok                  bool
	}{
		{http.MethodGet, "/v1/runs/20260101_000000_abcd", "/v1/runs/20260101_000000_abcd", true},
		{http.MethodPost, "/v1/runs/20260101_000000_abcd/replay", "/v1/runs/20260101_000000_abcd", true},
		{http.MethodGet, "/v1/runs/20260101_000000_abcd/replay", "", false},
		{http.MethodDelete, "/v1/runs/20260101_000000_abcd", "", false},
		{http.MethodGet, "/v1/runs/export", "", false},
		{http.MethodPost, "/v1/autofix/af-1/submit", "/v1/autofix/af-1", true},
		{http.MethodDelete, "/v1/snapshots/s1", "/v1/snapshots/s1", true},
		{http.MethodPost, "/v1/snapshots/s1/other", "", false},
	} {
		probe, ok := untaggedRoute(c.method, c.path)
		if probe != c.probe || ok != c.ok {
			t.Errorf("%s %s: (%q, %v), want (%q, %v)", c.method, c.path, probe, ok, c.probe, c.ok)
		}
	}
}
