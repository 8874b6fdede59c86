package tenants

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
)

// driver is a KeyStore implementation the tests run against: every test
// of the service runs on each, so that the two keep the same semantics.
type driver struct {
	name string
	open func(t *testing.T) KeyStore
}

var drivers = []driver{
	{"sqlite", func(t *testing.T) KeyStore {
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "sandboxd.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}},
	{"postgres", func(t *testing.T) KeyStore { return openPG(t, testenv.Postgres(t)) }},
}

func openPG(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func forDrivers(t *testing.T, fn func(t *testing.T, d driver)) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) { fn(t, d) })
	}
}
