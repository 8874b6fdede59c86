package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestParseMB(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"512M", 512, false},
		{"1G", 1024, false},
		{"1.5G", 1536, false},
		{"2048MiB", 2048, false},
		{"1048576", 1, false},
		{"512", 0, true}, // bytes, not a whole MiB
		{"100K", 0, true},
		{"lots", 0, true},
		{"-1G", 0, true},
	} {
		got, err := parseMB("memory", tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseMB(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && exitCode(err) != exitUsage {
			t.Errorf("parseMB(%q) error exits %d, want %d", tc.in, exitCode(err), exitUsage)
		}
	}
}

func TestParseKV(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want map[string]string
		err  bool
	}{
		{nil, nil, false},
		{[]string{"A=1", "B=x=y", "C="}, map[string]string{"A": "1", "B": "x=y", "C": ""}, false},
		{[]string{"A=1", "A=2"}, map[string]string{"A": "2"}, false},
		{[]string{"A"}, nil, true},
		{[]string{"=v"}, nil, true},
	} {
		got, err := parseKV("env", tc.in)
		if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseKV(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseCopy(t *testing.T) {
	for _, tc := range []struct {
		src, dst string
		from, to location
		err      bool
	}{
		{"sb-1:/workspace/a.txt", "a.txt", location{"sb-1", "/workspace/a.txt"}, location{"", "a.txt"}, false},
		{"./a:b", "sb-1:/w/", location{"", "./a:b"}, location{"sb-1", "/w/"}, false},
		{"/tmp/x", "sb-1:/w/x", location{"", "/tmp/x"}, location{"sb-1", "/w/x"}, false},
		{"-", "sb-1:/w/in", location{"", "-"}, location{"sb-1", "/w/in"}, false},
		{"sb-1:/w/out", "-", location{"sb-1", "/w/out"}, location{"", "-"}, false},
		{"dir/a:b", "sb-1:/w", location{"", "dir/a:b"}, location{"sb-1", "/w"}, false},
		{"a.txt", "b.txt", location{}, location{}, true},
		{"sb-1:/a", "sb-2:/b", location{}, location{}, true},
		{"sb-1:", "x", location{}, location{}, true},
	} {
		from, to, err := parseCopy(tc.src, tc.dst)
		if tc.err {
			if exitCode(err) != exitUsage {
				t.Errorf("parseCopy(%q, %q): %v, want a usage error", tc.src, tc.dst, err)
			}
			continue
		}
		if err != nil || from != tc.from || to != tc.to {
			t.Errorf("parseCopy(%q, %q) = %+v, %+v, %v; want %+v, %+v", tc.src, tc.dst, from, to, err, tc.from, tc.to)
		}
	}
}

func TestSeconds(t *testing.T) {
	if s, err := seconds("ttl", 1500*time.Millisecond); err != nil || s != 2 {
		t.Errorf("seconds(1.5s) = %d, %v; want 2", s, err)
	}
	if _, err := seconds("ttl", 0); exitCode(err) != exitUsage {
		t.Errorf("seconds(0): %v, want a usage error", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"ok", nil, 0},
		{"plain failure", errors.New("boom"), 1},
		{"usage", usagef("bad flag"), 2},
		{"invalid argument from the daemon", errdefs.Invalidf("memory_mb: too small"), 2},
		{"not found", fmt.Errorf("inspect: %w", errdefs.NotFoundf("sandbox sb-1 not found")), 3},
		{"conflict", errdefs.Conflictf("sandbox is terminated"), 1},
		{"daemon unavailable", errdefs.Unavailablef("seccomp"), 1},
		{"unauthenticated", &errdefs.Error{Code: "unauthenticated", Message: "bad token"}, 1},
		{"unreachable", fmt.Errorf("%w: dial unix: connection refused", client.ErrUnreachable), 4},
		{"unhealthy", &exitStatus{code: exitUnhealthy}, 5},
		{"command's own code", &exitStatus{code: 42}, 42},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestCommandExitCode(t *testing.T) {
	for _, tc := range []struct{ code, want int }{{0, 0}, {7, 7}, {137, 137}, {-1, 1}, {300, 1}} {
		if got := commandExitCode(&client.ExecResult{ExitCode: tc.code}); got != tc.want {
			t.Errorf("commandExitCode(%d) = %d, want %d", tc.code, got, tc.want)
		}
	}
}

// TestRunExitCodes runs whole command lines that fail before or at the
// connection to a daemon that is not there.
func TestRunExitCodes(t *testing.T) {
	missing := "--socket=" + filepath.Join(t.TempDir(), "api.sock")
	for _, tc := range []struct {
		args []string
		want int
		msg  string
	}{
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"ps", "--bogus"}, exitUsage, "unknown flag"},
		{[]string{"inspect"}, exitUsage, "accepts 1 arg"},
		{[]string{"ps", "--all", "--state", "ready", missing}, exitUsage, "exclusive"},
		{[]string{"exec", missing, "sb-1", "--"}, exitUsage, "missing command"},
		{[]string{"create", missing, "--memory", "12"}, exitUsage, "--memory"},
		{[]string{"create", missing, "--env", "NOVALUE"}, exitUsage, "--env"},
		{[]string{"create", missing, "--volume", "data"}, exitUsage, "--volume"},
		{[]string{"create", missing, "--volume", "data:/d:rx"}, exitUsage, "ro or rw"},
		{[]string{"volumes", "create", missing, "v", "--size", "12"}, exitUsage, "--size"},
		{[]string{"volumes", "rm", missing}, exitUsage, "requires at least 1 arg"},
		{[]string{"templates", "create", missing, "t", "--memory", "12"}, exitUsage, "--memory"},
		{[]string{"cp", missing, "a", "b"}, exitUsage, "exactly one"},
		{[]string{"--url", "ftp://x", "ps"}, exitUsage, "url"},
		{[]string{"ps", missing}, exitUnreachable, "daemon unreachable"},
		{[]string{"health", missing}, exitUnreachable, "daemon unreachable"},
	} {
		var stdout, stderr bytes.Buffer
		got := run(context.Background(), tc.args, &stdout, &stderr)
		if got != tc.want || !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("sandboxctl %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), got, stderr.String(), tc.want, tc.msg)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{{0, "0B"}, {1023, "1023B"}, {1024, "1KiB"}, {512 << 20, "512MiB"}, {1536 << 20, "1.5GiB"}, {1 << 40, "1TiB"}} {
		if got := humanBytes(tc.in); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
