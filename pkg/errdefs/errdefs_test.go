package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestKnown(t *testing.T) {
	for _, c := range Codes {
		if !Known(c) {
			t.Errorf("Known(%s) = false", c)
		}
	}
	if Known("weird") || Known("") {
		t.Error("Known accepts a code outside the taxonomy")
	}
}

func TestCodeOf(t *testing.T) {
	cause := errors.New("disk on fire")
	err := fmt.Errorf("create: %w", Wrap(Unavailable, cause, "image %q is not built", "go"))
	if CodeOf(err) != Unavailable || !Is(err, Unavailable) {
		t.Errorf("CodeOf(wrapped) = %s", CodeOf(err))
	}
	if MessageOf(err) != `create: image "go" is not built` {
		t.Errorf("MessageOf = %q: the client-safe message keeps the context added with %%w and not the cause", MessageOf(err))
	}
	if !errors.Is(err, cause) {
		t.Error("the cause is lost")
	}
	if CodeOf(errors.New("plain")) != Internal || CodeOf(nil) != "" {
		t.Error("a plain error is internal, nil has no code")
	}
	if m := MessageOf(fmt.Errorf("open /var/lib/secret: %w", errors.New("permission denied"))); m != "internal error" {
		t.Errorf("MessageOf(an error of no class) = %q, want \"internal error\" (the detail is for the log)", m)
	}
	if e := Invalidf("path: must be absolute, got %q", "x"); CodeOf(e) != InvalidArgument || MessageOf(e) != `path: must be absolute, got "x"` {
		t.Errorf("Invalidf = %v", e)
	}
}
