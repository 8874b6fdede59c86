package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestMappings(t *testing.T) {
	for _, c := range []struct {
		code   Code
		status int
		exit   int
	}{
		{InvalidArgument, http.StatusBadRequest, 2},
		{NotFound, http.StatusNotFound, 3},
		{Conflict, http.StatusConflict, 1},
		{LimitExceeded, http.StatusTooManyRequests, 1},
		{Unavailable, http.StatusServiceUnavailable, 1},
		{Internal, http.StatusInternalServerError, 1},
	} {
		if got := HTTPStatus(c.code); got != c.status {
			t.Errorf("HTTPStatus(%s) = %d, want %d", c.code, got, c.status)
		}
		if got := FromHTTPStatus(c.status); got != c.code {
			t.Errorf("FromHTTPStatus(%d) = %s, want %s", c.status, got, c.code)
		}
		if got := ExitCode(c.code); got != c.exit {
			t.Errorf("ExitCode(%s) = %d, want %d", c.code, got, c.exit)
		}
	}
	if HTTPStatus("") != http.StatusOK || ExitCode("") != 0 {
		t.Error("the empty code must map to success")
	}
}

func TestCodeOf(t *testing.T) {
	cause := errors.New("disk on fire")
	err := fmt.Errorf("create: %w", Wrap(Unavailable, cause, "image %q is not built", "go"))
	if CodeOf(err) != Unavailable || !Is(err, Unavailable) {
		t.Errorf("CodeOf(wrapped) = %s", CodeOf(err))
	}
	if MessageOf(err) != `image "go" is not built` {
		t.Errorf("MessageOf = %q: the client-safe message must not carry the cause", MessageOf(err))
	}
	if !errors.Is(err, cause) {
		t.Error("the cause is lost")
	}
	if CodeOf(errors.New("plain")) != Internal || CodeOf(nil) != "" {
		t.Error("a plain error is internal, nil has no code")
	}
	if e := Invalidf("path: must be absolute, got %q", "x"); CodeOf(e) != InvalidArgument || MessageOf(e) != `path: must be absolute, got "x"` {
		t.Errorf("Invalidf = %v", e)
	}
}
