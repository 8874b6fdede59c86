package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/tenants"
)

// BenchmarkExecAuth is an exec through the REST handler authenticated the
// old way (one token, Options.Token) and by the key store (pkg/tenants,
// a user key among 1,000), against the fake engine so that only the
// front end and its authentication are measured. It reports the median
// of the requests (median-ns/op) besides the mean.
func BenchmarkExecAuth(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ks, err := tenants.New(ctx, tenants.Options{Store: st, AdminToken: "0123456789abcdef0123456789abcdef"})
	if err != nil {
		b.Fatal(err)
	}
	defer ks.Close()
	var secret string
	for i := 0; i < 1000; i++ {
		k, err := ks.Create(ctx, apitypes.KeyCreateRequest{Name: fmt.Sprintf("k%04d", i)})
		if err != nil {
			b.Fatal(err)
		}
		secret = k.Secret
	}
	for _, tc := range []struct {
		name, key string
		opt       Options
	}{
		{"token", "0123456789abcdef0123456789abcdef", Options{Token: "0123456789abcdef0123456789abcdef"}},
		{"key", secret, Options{Auth: ks}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			hs := httptest.NewServer(NewHandler(&fakeEngine{}, tc.opt))
			defer hs.Close()
			c := hs.Client()
			body := `{"command":"true"}`
			ds := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/sb-1/exec", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+tc.key)
				start := time.Now()
				res, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				res.Body.Close()
				ds = append(ds, time.Since(start))
				if res.StatusCode != http.StatusOK {
					b.Fatalf("status %d", res.StatusCode)
				}
			}
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "median-ns/op")
		})
	}
}
