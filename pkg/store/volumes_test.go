package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestVolumeNamesPerTenant: two tenants may each have a volume of one
// name; the same tenant may not; rows are found by tenant and name, and
// changed and deleted by storage name.
func TestVolumeNamesPerTenant(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	now := time.Now()
	for _, r := range []*VolumeRecord{
		{Name: "data", Storage: "data.a", Tenant: "alice", State: "ready", SizeBytes: 1, Inodes: 1, CreatedAt: now},
		{Name: "data", Storage: "data.b", Tenant: "bob", State: "ready", SizeBytes: 2, Inodes: 1, CreatedAt: now},
	} {
		if err := s.InsertVolume(ctx, r); err != nil {
			t.Fatalf("insert %s of %s: %v", r.Name, r.Tenant, err)
		}
	}
	if err := s.InsertVolume(ctx, &VolumeRecord{Name: "data", Storage: "data.c", Tenant: "alice", State: "ready", CreatedAt: now}); !errors.Is(err, ErrExists) {
		t.Fatalf("alice's second data: %v, want ErrExists", err)
	}
	b, err := s.GetVolume(ctx, "bob", "data")
	if err != nil || b.Storage != "data.b" || b.SizeBytes != 2 {
		t.Fatalf("bob's data: %+v %v", b, err)
	}
	if _, err := s.GetVolume(ctx, "carol", "data"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("carol's data: %v", err)
	}
	if err := s.SetVolumeState(ctx, "data.a", "deleting"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "data.a"); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListVolumes(ctx)
	if err != nil || len(all) != 1 || all[0].Tenant != "bob" || all[0].State != "ready" {
		t.Fatalf("after deleting alice's: %+v %v", all, err)
	}
}

// TestMigration14KeepsVolumesAndExposures: a database of version 13 keeps
// its volumes (storage name = name, where their files are) and its
// exposures (made with no key) through migration 14.
func TestMigration14KeepsVolumesAndExposures(t *testing.T) {
	full := migrations
	defer func() { migrations = full }()
	migrations = full[:13]
	path := filepath.Join(t.TempDir(), "state.db")
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, `INSERT INTO volumes (name, state, size_bytes, inodes, tenant, created_by, created_at) VALUES ('old', 'ready', 5, 6, 'alice', 'alice', 7)`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, `INSERT INTO port_exposures (sandbox_id, port, token, created_at) VALUES ('sb1', 80, 'tok', 1)`); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	migrations = full
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.GetVolume(ctx, "alice", "old")
	if err != nil || v.Storage != "old" || v.State != "ready" || v.SizeBytes != 5 || v.Inodes != 6 || v.CreatedBy != "alice" {
		t.Fatalf("migrated volume: %+v %v", v, err)
	}
	xs, err := s.ListPortExposures(ctx)
	if err != nil || len(xs) != 1 || xs[0].Token != "tok" || xs[0].KeyID != "" {
		t.Fatalf("migrated exposures: %+v %v", xs, err)
	}
}
