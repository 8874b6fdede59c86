package autofix

import (
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	one := Files{"main.py": []byte("print(x)\n")}
	two := Files{"main.py": []byte("import util\nprint(util.X)\n"), "util.py": []byte("X = 1\n")}
	tests := []struct {
		name    string
		files   Files
		answer  string
		want    Files
		refused string // substring of the refusal
	}{
		{name: "whole answer, one file", files: one, answer: "print(1)", want: Files{"main.py": []byte("print(1)\n")}},
		{name: "bare fence", files: one, answer: "Here:\n```python\nprint(2)\n```\nDone.", want: Files{"main.py": []byte("print(2)\n")}},
		{name: "named fence", files: two, answer: "```python util.py\nX = 2\n```\n",
			want: Files{"main.py": two["main.py"], "util.py": []byte("X = 2\n")}},
		{name: "named fence adds a file", files: one, answer: "```text requirements.txt\nflask\n```\n```python main.py\nimport flask\n```\n",
			want: Files{"main.py": []byte("import flask\n"), "requirements.txt": []byte("flask\n")}},
		{name: "four-backtick fence, absolute path", files: one, answer: "````python /workspace/main.py\nprint(3)\n````\n",
			want: Files{"main.py": []byte("print(3)\n")}},
		{name: "git diff", files: two, answer: "diff --git a/util.py b/util.py\n--- a/util.py\n+++ b/util.py\n@@ -1 +1 @@\n-X = 1\n+X = 3\n",
			want: Files{"main.py": two["main.py"], "util.py": []byte("X = 3\n")}},
		{name: "traditional diff in a fence", files: one, answer: "```diff\n--- a/main.py\n+++ b/main.py\n@@ -1 +1,2 @@\n+x = 1\n print(x)\n```\n",
			want: Files{"main.py": []byte("x = 1\nprint(x)\n")}},
		{name: "diff creating a file", files: one, answer: "--- /dev/null\n+++ b/requirements.txt\n@@ -0,0 +1 @@\n+flask\n",
			want: Files{"main.py": one["main.py"], "requirements.txt": []byte("flask\n")}},
		{name: "diff deleting a file", files: two, answer: "--- a/util.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n",
			want: Files{"main.py": two["main.py"]}},
		{name: "diff that does not apply", files: one, answer: "--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-print(y)\n+print(1)\n", refused: "does not apply"},
		{name: "diff outside the workspace", files: one, answer: "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+toor\n", refused: "outside /workspace"},
		{name: "diff escaping with ..", files: one, answer: "--- /dev/null\n+++ ../../etc/cron.d/x\n@@ -0,0 +1 @@\n+* * * * * root sh\n", refused: "outside /workspace"},
		{name: "fence outside the workspace", files: one, answer: "```sh /etc/profile\nevil\n```\n", refused: "outside /workspace"},
		{name: "fence to a sibling of the workspace", files: one, answer: "```sh /workspace2/x.sh\nevil\n```\n", refused: "outside /workspace"},
		{name: "diff of a missing file", files: one, answer: "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n", refused: "does not exist"},
		{name: "unnamed block, two files", files: two, answer: "```python\nprint(1)\n```\n", refused: "has 2 files"},
		{name: "empty answer", files: one, answer: "  \n", refused: "empty"},
		{name: "two unnamed blocks", files: one, answer: "```\na\n```\n```\nb\n```\n", refused: "2 unnamed"},
		{name: "file and directory", files: one, answer: "```python main.py/x.py\n1\n```\n", refused: "both a file and a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Apply(tc.files, "main.py", tc.answer)
			if tc.refused != "" {
				if err == nil || !IsRefused(err) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("Apply = %v, %v; want a refusal containing %q", got, err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if !got.Equal(tc.want) {
				t.Fatalf("Apply = %q, want %q", got, tc.want)
			}
		})
	}
}

// A diff produced by UnifiedDiff applies back with Apply: the two
// libraries agree on the format.
func TestUnifiedDiffRoundTrip(t *testing.T) {
	old := Files{"main.py": []byte("a\nb\nc\n"), "gone.txt": []byte("x\n"), "keep.txt": []byte("k\n")}
	new := Files{"main.py": []byte("a\nB\nc\nd\n"), "new/file.txt": []byte("n\n"), "keep.txt": []byte("k\n")}
	d := UnifiedDiff(old, new)
	for _, want := range []string{"--- a/main.py", "+++ b/main.py", "-b", "+B", "+++ /dev/null", "--- /dev/null", "+++ b/new/file.txt"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	got, err := Apply(old, "main.py", d)
	if err != nil {
		t.Fatalf("apply own diff: %v\n%s", err, d)
	}
	if !got.Equal(new) {
		t.Fatalf("round trip = %q, want %q", got, new)
	}
	if s := Summary(old, new); s != "gone.txt (deleted), main.py +2 -1, new/file.txt (new, 1 lines)" {
		t.Errorf("Summary = %q", s)
	}
	if UnifiedDiff(old, old) != "" {
		t.Error("diff of identical files is not empty")
	}
}

func TestInfoPath(t *testing.T) {
	for info, want := range map[string]string{
		"python main.py": "main.py", "main.py": "main.py", "python": "", "": "", "c++": "",
		"go path=cmd/x/main.go": "cmd/x/main.go", `js title="app.js"`: "app.js", "make Makefile": "Makefile",
	} {
		if got := infoPath(info); got != want {
			t.Errorf("infoPath(%q) = %q, want %q", info, got, want)
		}
	}
}

func TestIsDependencyFile(t *testing.T) {
	for name, want := range map[string]bool{
		"requirements.txt": true, "sub/package.json": true, "go.mod": true, "requirements-dev.txt": true,
		"main.py": false, "README.md": false,
	} {
		if IsDependencyFile(name) != want {
			t.Errorf("IsDependencyFile(%q) = %v", name, !want)
		}
	}
}
