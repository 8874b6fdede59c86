package principal

import (
	"context"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	if _, ok := From(ctx); ok {
		t.Fatal("a bare context has a principal")
	}
	p := Principal{KeyID: "k1", KeyName: "ci", Tenant: "t-a"}
	ctx = WithOrigin(With(ctx, p), Origin{FrontEnd: "rest", Source: "127.0.0.1:5"})
	got, ok := From(ctx)
	if !ok || got != p {
		t.Fatalf("From = %+v, %v; want %+v", got, ok, p)
	}
	if o := OriginFrom(ctx); o.FrontEnd != "rest" || o.Source != "127.0.0.1:5" {
		t.Fatalf("OriginFrom = %+v", o)
	}
}
