package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

func TestCommitOpenAbortPrune(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "artifacts"))
	w, err := s.Create("sb-1", "alice", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("archive bytes")); err != nil {
		t.Fatal(err)
	}
	art, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("archive bytes"))
	if art.Size != 13 || art.SHA256 != hex.EncodeToString(sum[:]) || !ValidID(art.ID) {
		t.Fatalf("artifact = %+v", art)
	}
	w.Abort() // no-op after Commit
	got, rc, err := s.Open(context.Background(), art.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "archive bytes" || got.SandboxID != "sb-1" || got.Path != "/workspace" {
		t.Fatalf("open = %+v %q", got, b)
	}

	w2, err := s.Create("sb-1", "alice", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	w2.Abort()
	if _, _, err := s.Open(context.Background(), w2.art.ID); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("aborted artifact: %v", err)
	}
	if _, err := os.Stat(s.path(w2.art.ID, ".tar.gz")); !os.IsNotExist(err) {
		t.Fatalf("aborted archive left on disk: %v", err)
	}
	if _, _, err := s.Open(context.Background(), "../../etc/passwd"); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Fatalf("malformed id: %v", err)
	}

	old := time.Now().Add(-2 * time.Hour)
	for _, ext := range []string{".tar.gz", ".json"} {
		if err := os.Chtimes(s.path(art.ID, ext), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Prune(time.Hour); n != 2 {
		t.Fatalf("pruned %d files, want 2", n)
	}
	if _, _, err := s.Open(context.Background(), art.ID); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("pruned artifact: %v", err)
	}
}

// TestTenantOwnsArchive: an archive outlives its sandbox, so its tenant is
// checked on the archive itself: another tenant's key gets exactly the
// answer of an id that does not exist, the owner and admins get it, and an
// archive recorded without a tenant is the administrator's only.
func TestTenantOwnsArchive(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "artifacts"))
	mk := func(tenant string) string {
		w, err := s.Create("sb-1", tenant, "/workspace")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte("x"))
		art, err := w.Commit()
		if err != nil {
			t.Fatal(err)
		}
		return art.ID
	}
	alices, nobodys := mk("alice"), mk("")
	as := func(p principal.Principal) context.Context { return principal.With(context.Background(), p) }
	alice := as(principal.Principal{KeyID: "k1", KeyName: "alice", Tenant: "alice"})
	bob := as(principal.Principal{KeyID: "k2", KeyName: "bob", Tenant: "bob"})
	admin := as(principal.Principal{KeyID: "k3", KeyName: "ops", Tenant: "ops", Admin: true})
	absent := "art-0123456789abcdef"
	_, _, errAbsent := s.Open(bob, absent)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		ok   bool
	}{
		{"owner", alice, alices, true},
		{"admin", admin, alices, true},
		{"engine (no principal)", context.Background(), alices, true},
		{"other tenant", bob, alices, false},
		{"tenant, archive of no tenant", alice, nobodys, false},
		{"admin, archive of no tenant", admin, nobodys, true},
	} {
		art, rc, err := s.Open(tc.ctx, tc.id)
		if tc.ok {
			if err != nil || art.ID != tc.id {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			rc.Close()
			continue
		}
		want := strings.Replace(errAbsent.Error(), absent, tc.id, 1)
		if errdefs.CodeOf(err) != errdefs.NotFound || err.Error() != want || rc != nil {
			t.Errorf("%s: %v, want %q", tc.name, err, want)
		}
	}
	if art, rc, err := s.Open(admin, alices); err == nil {
		rc.Close()
		if art.Tenant != "alice" {
			t.Errorf("admin sees tenant %q, want alice", art.Tenant)
		}
	}
}
