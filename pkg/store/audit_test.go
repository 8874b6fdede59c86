package store

import (
	"context"
	"testing"
	"time"
)

// TestAuditCheckpoints: saved, listed in order, replaced by seq, pruned
// below a seq, and still there after a reopen.
func TestAuditCheckpoints(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	at := time.Unix(1700000000, 5)
	for _, c := range []AuditCheckpoint{{Seq: 512, Hash: "b", At: at}, {Seq: 256, Hash: "a", At: at}, {Seq: 512, Hash: "c", At: at}, {Seq: 768, Hash: "d", At: at}} {
		if err := s.SaveAuditCheckpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteAuditCheckpointsBefore(ctx, 300); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.AuditCheckpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq != 512 || got[0].Hash != "c" || got[1].Seq != 768 || !got[1].At.Equal(at) {
		t.Fatalf("checkpoints %+v", got)
	}
}
