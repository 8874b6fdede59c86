package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// allLanguages are the languages of issue 4.
var allLanguages = []string{"python", "javascript", "typescript", "go", "rust", "java", "c", "cpp", "csharp", "shell"}

// ensureImages builds language images into the shared test cache.
var ensureImages = testenv.EnsureImages

// newRunEngine is a test engine with the language images built and limits
// the compiled toolchains fit in.
func newRunEngine(t testing.TB, langs []string, tweak ...func(*config.Config)) *testEnv {
	t.Helper()
	requireRoot(t)
	ensureImages(t, langs...)
	return newTestEngine(t, append([]func(*config.Config){func(c *config.Config) {
		c.Sandbox.Memory = 1 << 30
		c.Sandbox.Disk = 1 << 30
	}}, tweak...)...)
}

// langCase is what each language must do.
type langCase struct {
	hello      string            // prints "hello, world"
	echo       string            // prints "args=<args joined by ,>" and "stdin=<stdin trimmed>"
	crash      string            // a runtime error
	crashText  string            // expected on stderr
	broken     string            // a compile error ("" for interpreted languages)
	brokenText string            // expected in the compile step's output
	twoFiles   map[string]string // prints "hello, two"
}

var langCases = map[string]langCase{
	"python": {
		hello: "print('hello, world')\n",
		echo:  "import sys\nprint('args=' + ','.join(sys.argv[1:]))\nprint('stdin=' + sys.stdin.read().strip())\n",
		crash: "x = 1\nprint(x / 0)\n", crashText: "ZeroDivisionError: division by zero",
		twoFiles: map[string]string{
			"main.py":  "from greet import greet\nprint(greet('two'))\n",
			"greet.py": "def greet(n):\n    return 'hello, ' + n\n",
		},
	},
	"javascript": {
		hello: "console.log('hello, world');\n",
		echo: "const fs = require('fs');\nconsole.log('args=' + process.argv.slice(2).join(','));\n" +
			"console.log('stdin=' + fs.readFileSync(0, 'utf8').trim());\n",
		crash: "const o = null;\nconsole.log(o.x);\n", crashText: "TypeError: Cannot read properties of null",
		twoFiles: map[string]string{
			"main.js":  "const { greet } = require('./greet');\nconsole.log(greet('two'));\n",
			"greet.js": "exports.greet = (n) => 'hello, ' + n;\n",
		},
	},
	"typescript": {
		hello: "const greeting: string = 'hello, world';\nconsole.log(greeting);\n",
		echo: "import * as fs from 'fs';\nconst args: string[] = process.argv.slice(2);\nconsole.log('args=' + args.join(','));\n" +
			"console.log('stdin=' + fs.readFileSync(0, 'utf8').trim());\n",
		crash: "const o: any = null;\nconsole.log(o.x);\n", crashText: "TypeError: Cannot read properties of null",
		broken: "const n: number = 'not a number';\nconsole.log(n);\n", brokenText: "error TS2322",
		twoFiles: map[string]string{
			"main.ts":  "import { greet } from './greet';\nconsole.log(greet('two'));\n",
			"greet.ts": "export function greet(n: string): string {\n  return 'hello, ' + n;\n}\n",
		},
	},
	"go": {
		hello: "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello, world\") }\n",
		echo: "package main\n\nimport (\n\t\"fmt\"\n\t\"io\"\n\t\"os\"\n\t\"strings\"\n)\n\nfunc main() {\n\tin, _ := io.ReadAll(os.Stdin)\n" +
			"\tfmt.Println(\"args=\" + strings.Join(os.Args[1:], \",\"))\n\tfmt.Println(\"stdin=\" + strings.TrimSpace(string(in)))\n}\n",
		crash: "package main\n\nfunc main() { panic(\"boom\") }\n", crashText: "panic: boom",
		broken: "package main\n\nfunc main() {\n\tx := 1\n}\n", brokenText: "declared but not used",
		twoFiles: map[string]string{
			"main.go":  "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(greet(\"two\")) }\n",
			"greet.go": "package main\n\nfunc greet(n string) string { return \"hello, \" + n }\n",
		},
	},
	"rust": {
		hello: "fn main() {\n    println!(\"hello, world\");\n}\n",
		echo: "use std::io::Read;\n\nfn main() {\n    let args: Vec<String> = std::env::args().skip(1).collect();\n" +
			"    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n" +
			"    println!(\"args={}\", args.join(\",\"));\n    println!(\"stdin={}\", s.trim());\n}\n",
		crash: "fn main() {\n    let v: Vec<i32> = Vec::new();\n    println!(\"{}\", v[3]);\n}\n", crashText: "panicked at",
		broken: "fn main() {\n    let x: i32 = \"s\";\n    println!(\"{}\", x);\n}\n", brokenText: "error[E0308]: mismatched types",
		twoFiles: map[string]string{
			"main.rs":  "mod greet;\n\nfn main() {\n    println!(\"{}\", greet::greet(\"two\"));\n}\n",
			"greet.rs": "pub fn greet(n: &str) -> String {\n    format!(\"hello, {}\", n)\n}\n",
		},
	},
	"java": {
		hello: "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"hello, world\");\n    }\n}\n",
		echo: "import java.io.IOException;\n\npublic class Main {\n    public static void main(String[] args) throws IOException {\n" +
			"        String in = new String(System.in.readAllBytes()).trim();\n" +
			"        System.out.println(\"args=\" + String.join(\",\", args));\n        System.out.println(\"stdin=\" + in);\n    }\n}\n",
		crash:      "public class Main {\n    public static void main(String[] args) {\n        throw new IllegalStateException(\"boom\");\n    }\n}\n",
		crashText:  "Exception in thread \"main\" java.lang.IllegalStateException: boom",
		broken:     "public class Main {\n    public static void main(String[] args) {\n        int x = \"s\";\n    }\n}\n",
		brokenText: "error: incompatible types",
		twoFiles: map[string]string{
			"Main.java":  "public class Main {\n    public static void main(String[] args) {\n        System.out.println(Greet.greet(\"two\"));\n    }\n}\n",
			"Greet.java": "public class Greet {\n    static String greet(String n) {\n        return \"hello, \" + n;\n    }\n}\n",
		},
	},
	"c": {
		hello: "#include <stdio.h>\n\nint main(void) {\n    puts(\"hello, world\");\n    return 0;\n}\n",
		echo: "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    char buf[256] = {0};\n    size_t n = fread(buf, 1, sizeof buf - 1, stdin);\n" +
			"    while (n > 0 && buf[n - 1] == '\\n') buf[--n] = 0;\n    printf(\"args=\");\n" +
			"    for (int i = 1; i < argc; i++) printf(\"%s%s\", i > 1 ? \",\" : \"\", argv[i]);\n" +
			"    printf(\"\\nstdin=%s\\n\", buf);\n    return 0;\n}\n",
		crash:     "#include <assert.h>\n\nint main(void) {\n    int x = 1;\n    assert(x == 2);\n    return 0;\n}\n",
		crashText: "Assertion `x == 2' failed",
		broken:    "int main(void) {\n    return undefined_variable;\n}\n", brokenText: "undefined_variable’ undeclared",
		twoFiles: map[string]string{
			"main.c":  "#include \"greet.h\"\n\nint main(void) {\n    greet(\"two\");\n    return 0;\n}\n",
			"greet.h": "void greet(const char *name);\n",
			"greet.c": "#include <stdio.h>\n#include \"greet.h\"\n\nvoid greet(const char *name) { printf(\"hello, %s\\n\", name); }\n",
		},
	},
	"cpp": {
		hello: "#include <iostream>\n\nint main() {\n    std::cout << \"hello, world\" << std::endl;\n}\n",
		echo: "#include <iostream>\n#include <iterator>\n#include <string>\n\nint main(int argc, char **argv) {\n" +
			"    std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());\n" +
			"    while (!in.empty() && in.back() == '\\n') in.pop_back();\n    std::cout << \"args=\";\n" +
			"    for (int i = 1; i < argc; i++) std::cout << (i > 1 ? \",\" : \"\") << argv[i];\n" +
			"    std::cout << \"\\nstdin=\" << in << \"\\n\";\n}\n",
		crash:     "#include <stdexcept>\n\nint main() {\n    throw std::runtime_error(\"boom\");\n}\n",
		crashText: "terminate called after throwing an instance of 'std::runtime_error'",
		broken:    "int main() {\n    int x = \"s\";\n    return x;\n}\n", brokenText: "error: invalid conversion",
		twoFiles: map[string]string{
			"main.cpp":  "#include <iostream>\n#include \"greet.hpp\"\n\nint main() {\n    std::cout << greet(\"two\") << std::endl;\n}\n",
			"greet.hpp": "#include <string>\n\nstd::string greet(const std::string &name);\n",
			"greet.cpp": "#include \"greet.hpp\"\n\nstd::string greet(const std::string &name) { return \"hello, \" + name; }\n",
		},
	},
	"csharp": {
		hello: "class Program {\n    static void Main() {\n        System.Console.WriteLine(\"hello, world\");\n    }\n}\n",
		echo: "using System;\n\nclass Program {\n    static void Main(string[] args) {\n        string input = Console.In.ReadToEnd().Trim();\n" +
			"        Console.WriteLine(\"args=\" + string.Join(\",\", args));\n        Console.WriteLine(\"stdin=\" + input);\n    }\n}\n",
		crash:     "using System;\n\nclass Program {\n    static void Main() {\n        throw new InvalidOperationException(\"boom\");\n    }\n}\n",
		crashText: "System.InvalidOperationException: boom",
		broken:    "class Program {\n    static void Main() {\n        int x = \"s\";\n    }\n}\n", brokenText: "error CS0029",
		twoFiles: map[string]string{
			"Program.cs": "class Program {\n    static void Main() {\n        System.Console.WriteLine(Greeter.Greet(\"two\"));\n    }\n}\n",
			"Greeter.cs": "static class Greeter {\n    public static string Greet(string name) { return \"hello, \" + name; }\n}\n",
		},
	},
	"shell": {
		hello:     "echo 'hello, world'\n",
		echo:      "echo \"args=$(IFS=,; echo \"$*\")\"\necho \"stdin=$(cat)\"\n",
		crash:     "nosuchcommand_xyz\n",
		crashText: "nosuchcommand_xyz: command not found",
		twoFiles: map[string]string{
			"main.sh": ". ./lib.sh\ngreet two\n",
			"lib.sh":  "greet() { echo \"hello, $1\"; }\n",
		},
	},
}

func (env *testEnv) runCode(t *testing.T, req RunCodeRequest) *RunResult {
	t.Helper()
	res, err := env.RunCode(context.Background(), req, nil)
	if err != nil {
		t.Fatalf("RunCode(%s): %v", req.Language, err)
	}
	return res
}

func stepNames(res *RunResult) []string {
	var out []string
	for _, s := range res.Steps {
		out = append(out, s.Name)
	}
	return out
}

func describe(res *RunResult) string {
	b, _ := json.MarshalIndent(res, "", "  ")
	if len(b) > 4000 {
		b = b[:4000]
	}
	return string(b)
}

// TestRunCodeLanguages is issue 4's acceptance for every language.
func TestRunCodeLanguages(t *testing.T) {
	env := newRunEngine(t, allLanguages)
	for _, name := range allLanguages {
		tc := langCases[name]
		t.Run(name, func(t *testing.T) {
			compiled := tc.broken != ""
			wantSteps := []string{StepRun}
			if compiled {
				wantSteps = []string{StepCompile, StepRun}
			}
			t.Run("hello", func(t *testing.T) {
				res := env.runCode(t, RunCodeRequest{Language: name, Code: tc.hello})
				if res.Stdout != "hello, world\n" || res.ExitCode != 0 || !res.Success || !slices.Equal(stepNames(res), wantSteps) {
					t.Fatalf("hello world: %s", describe(res))
				}
				env.checkRecord(t, res)
			})
			t.Run("stdin_args", func(t *testing.T) {
				res := env.runCode(t, RunCodeRequest{Language: name, Code: tc.echo, Args: []string{"a", "b c"}, Stdin: "hello from stdin\n"})
				if want := "args=a,b c\nstdin=hello from stdin\n"; res.Stdout != want || res.ExitCode != 0 {
					t.Fatalf("stdout %q, want %q: %s", res.Stdout, want, describe(res))
				}
			})
			t.Run("runtime_error", func(t *testing.T) {
				res := env.runCode(t, RunCodeRequest{Language: name, Code: tc.crash})
				if res.ExitCode == 0 || res.Success || !strings.Contains(res.Stderr, tc.crashText) {
					t.Fatalf("want a non-zero exit and %q on stderr: %s", tc.crashText, describe(res))
				}
				if last := res.Steps[len(res.Steps)-1]; last.Name != StepRun {
					t.Fatalf("runtime error in step %s", last.Name)
				}
				env.checkRecord(t, res)
			})
			if compiled {
				t.Run("compile_error", func(t *testing.T) {
					res := env.runCode(t, RunCodeRequest{Language: name, Code: tc.broken})
					if !slices.Equal(stepNames(res), []string{StepCompile}) || res.ExitCode == 0 || res.Success {
						t.Fatalf("want only a failed compile step: %s", describe(res))
					}
					if out := res.Stdout + res.Stderr; !strings.Contains(out, tc.brokenText) {
						t.Fatalf("compile output lacks %q: %s", tc.brokenText, describe(res))
					}
					env.checkRecord(t, res)
				})
			}
			t.Run("two_files", func(t *testing.T) {
				res := env.runCode(t, RunCodeRequest{Language: name, Files: tc.twoFiles})
				if res.Stdout != "hello, two\n" || res.ExitCode != 0 {
					t.Fatalf("two files: %s", describe(res))
				}
			})
			if ids := env.liveIDs(t); len(ids) != 0 {
				t.Fatalf("ephemeral runs left sandboxes behind: %v", ids)
			}
		})
	}
}

// checkRecord checks a run's record against docs/SPEC.md's layout and the result.
func (env *testEnv) checkRecord(t *testing.T, res *RunResult) *runs.Metadata {
	t.Helper()
	dir := filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID)
	if !runs.ValidID(res.RunID) {
		t.Fatalf("run id %q", res.RunID)
	}
	for _, f := range []string{"code_snapshot", "stdout.log", "stderr.log", "container_info.json", "fixed_attempts.json", "metadata.json", "output"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("record: %v", err)
		}
	}
	var m runs.Metadata
	b, err := os.ReadFile(filepath.Join(dir, "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	for _, k := range []string{"runId", "language", "startTime", "endTime", "durationMs", "exitCode", "attempts", "success", "image", "sandboxId", "termination"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("metadata.json lacks %s", k)
		}
	}
	if m.RunID != res.RunID || m.Language != res.Language || m.ExitCode != res.ExitCode || m.Success != res.Success ||
		m.SandboxID != res.SandboxID || m.DurationMS != res.DurationMS || m.Termination.Cause != res.Termination.Cause ||
		m.Attempts != 1 || m.Image != res.Language || len(m.Steps) != len(res.Steps) || m.StartTime.IsZero() || m.EndTime.Before(m.StartTime) {
		t.Errorf("metadata.json %s disagrees with the result %s", b, describe(res))
	}
	var ci map[string]any
	if b, err := os.ReadFile(filepath.Join(dir, "container_info.json")); err != nil || json.Unmarshal(b, &ci) != nil || ci["sandboxId"] != res.SandboxID {
		t.Errorf("container_info.json: %s (%v)", b, err)
	}
	got, err := env.GetRun(context.Background(), res.RunID, 0)
	if err != nil || got.Metadata.RunID != res.RunID {
		t.Errorf("GetRun: %v", err)
	}
	return &m
}

func TestRunCodeRecord(t *testing.T) {
	env := newRunEngine(t, []string{"python"}, func(c *config.Config) {
		c.Sandbox.OutputLimit = 128 << 20
		c.Runs.LogCap = 40 << 20
	})
	ctx := context.Background()
	code := "import os\nos.makedirs('output/sub', exist_ok=True)\nopen('output/sub/result.txt', 'w').write('42')\n" +
		"print('out')\nimport sys\nprint('err', file=sys.stderr)\n"
	res := env.runCode(t, RunCodeRequest{Language: "python", Files: map[string]string{"main.py": code, "/workspace/data/input.txt": "x"}})
	m := env.checkRecord(t, res)
	dir := filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID)
	for f, want := range map[string]string{
		"stdout.log": "out\n", "stderr.log": "err\n", "output/sub/result.txt": "42",
		"code_snapshot/main.py": code, "code_snapshot/data/input.txt": "x", "fixed_attempts.json": "[]\n",
	} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", f, b, err, want)
		}
	}
	if !slices.Equal(res.OutputFiles, []string{"sub/result.txt"}) || m.OutputFiles != 1 {
		t.Errorf("output files %v", res.OutputFiles)
	}
	list, err := env.ListRuns(ctx, RunFilter{Language: "python"})
	if err != nil || len(list) != 1 || list[0].RunID != res.RunID {
		t.Errorf("ListRuns = %v, %v", list, err)
	}

	// 50 MiB of stdout: the answer is cut, the log keeps up to the cap.
	const size = 50 << 20
	res = env.runCode(t, RunCodeRequest{Language: "python", MaxOutputBytes: 1 << 20,
		Code: "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(51200):\n    sys.stdout.write(line)\n"})
	if res.ExitCode != 0 || !res.StdoutTruncated || len(res.Stdout) != 1<<20 {
		t.Fatalf("50 MiB run: exit %d truncated %v len %d cause %s", res.ExitCode, res.StdoutTruncated, len(res.Stdout), res.Termination.Cause)
	}
	m = env.checkRecord(t, res)
	fi, err := os.Stat(filepath.Join(env.cfg.Paths.StateDir, "runs", res.RunID, "stdout.log"))
	// If this fails with stdoutBytes below 50 MiB, output was lost between
	// the program and the daemon: the agent keeps only a tail
	// (--retain-bytes) and an attached reader that falls behind skips what
	// fell out of it, instead of the agent holding the program back.
	if err != nil || fi.Size() != 40<<20 || m.StdoutBytes != size || m.StdoutLogged != 40<<20 {
		t.Fatalf("stdout.log size %d (%v), metadata stdoutBytes %d logged %d; want the %d-byte cap of %d written", fi.Size(), err, m.StdoutBytes, m.StdoutLogged, 40<<20, size)
	}
}

func TestRunCodeGivenSandbox(t *testing.T) {
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{Language: "python"})
	res := env.runCode(t, RunCodeRequest{Language: "python", SandboxID: info.ID, Code: "print('in place')"})
	if res.Stdout != "in place\n" || res.SandboxID != info.ID {
		t.Fatalf("run in sandbox: %s", describe(res))
	}
	got, err := env.GetSandbox(ctx, info.ID)
	if err != nil || got.State != sandbox.StateReady {
		t.Fatalf("sandbox after the run: %v %v", got, err)
	}
	// The files stay for the next call.
	if r := env.sh(t, info.ID, "cat /workspace/main.py"); r.Stdout != "print('in place')" {
		t.Errorf("main.py = %q", r.Stdout)
	}
	m := env.checkRecord(t, res)
	if m.Ephemeral {
		t.Error("metadata says ephemeral")
	}
	// A sandbox of another language is refused.
	sh := env.create(t, CreateSandboxRequest{Language: "shell"})
	if _, err := env.RunCode(ctx, RunCodeRequest{Language: "python", SandboxID: sh.ID, Code: "print(1)"}, nil); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Errorf("python in a shell sandbox: %v", err)
	}
}

func TestRunCodeBadInput(t *testing.T) {
	env := newRunEngine(t, []string{"python"})
	ctx := context.Background()
	big := strings.Repeat("x", MaxRunFilesBytes+1)
	for _, tt := range []struct {
		name  string
		req   RunCodeRequest
		code  errdefs.Code
		field string
	}{
		{"unknown language", RunCodeRequest{Language: "cobol", Code: "x"}, errdefs.InvalidArgument, "language"},
		{"no language", RunCodeRequest{Code: "x"}, errdefs.InvalidArgument, "language"},
		{"empty", RunCodeRequest{Language: "python"}, errdefs.InvalidArgument, "code"},
		{"absolute outside", RunCodeRequest{Language: "python", Files: map[string]string{"/etc/passwd": "x", "main.py": "1"}}, errdefs.InvalidArgument, "files"},
		{"dotdot", RunCodeRequest{Language: "python", Files: map[string]string{"../x.py": "x"}}, errdefs.InvalidArgument, "files"},
		{"sneaky", RunCodeRequest{Language: "python", Files: map[string]string{"/workspace/../etc/x.py": "x"}}, errdefs.InvalidArgument, "files"},
		{"too big", RunCodeRequest{Language: "python", Files: map[string]string{"main.py": big}}, errdefs.LimitExceeded, "files"},
		{"no entrypoint", RunCodeRequest{Language: "python", Files: map[string]string{"a.py": "", "b.py": ""}}, errdefs.InvalidArgument, "entrypoint"},
		{"bad timeout", RunCodeRequest{Language: "python", Code: "1", TimeoutSeconds: ptr(-1.0)}, errdefs.InvalidArgument, "timeout_seconds"},
		{"nul arg", RunCodeRequest{Language: "python", Code: "1", Args: []string{"a\x00"}}, errdefs.InvalidArgument, "args"},
		{"bad sandbox", RunCodeRequest{Language: "python", Code: "1", SandboxID: "a/b"}, errdefs.InvalidArgument, "sandbox_id"},
	} {
		_, err := env.RunCode(ctx, tt.req, nil)
		if errdefs.CodeOf(err) != tt.code || !strings.HasPrefix(errdefs.MessageOf(err), tt.field) {
			t.Errorf("%s: err = %v (%s), want %s naming %s", tt.name, err, errdefs.CodeOf(err), tt.code, tt.field)
		}
	}
	if ids := env.liveIDs(t); len(ids) != 0 {
		t.Fatalf("bad input left sandboxes: %v", ids)
	}
	if list, _ := env.ListRuns(ctx, RunFilter{}); len(list) != 0 {
		t.Errorf("bad input left run records: %v", list)
	}
}

func TestRunCodeDependencies(t *testing.T) {
	env := newRunEngine(t, []string{"python", "javascript"})
	ctx := context.Background()
	t.Run("python_wheel", func(t *testing.T) {
		res := env.runCode(t, RunCodeRequest{Language: "python", Files: map[string]string{
			"main.py":                                "import hellowheel\nprint(hellowheel.hi())\n",
			"requirements.txt":                       "--find-links wheels\nhellowheel==0.1\n",
			"wheels/hellowheel-0.1-py3-none-any.whl": string(testenv.Wheel(t, "hellowheel", "0.1", "def hi():\n    return 'hi from a wheel'\n")),
		}})
		if res.Stdout != "hi from a wheel\n" || !slices.Equal(stepNames(res), []string{StepInstall, StepRun}) {
			t.Fatalf("wheel: %s", describe(res))
		}
	})
	t.Run("npm_tarball", func(t *testing.T) {
		tgz := testenv.NPMTarball(t, map[string]string{
			"package.json": `{"name": "hello-tgz", "version": "1.0.0", "main": "index.js"}`,
			"index.js":     "module.exports = () => 'hi from a tarball';\n",
		})
		res := env.runCode(t, RunCodeRequest{Language: "javascript", Files: map[string]string{
			"main.js":             "console.log(require('hello-tgz')());\n",
			"package.json":        `{"name": "app", "version": "1.0.0", "dependencies": {"hello-tgz": "file:hello-tgz-1.0.0.tgz"}}`,
			"hello-tgz-1.0.0.tgz": string(tgz),
		}})
		if res.Stdout != "hi from a tarball\n" || !slices.Equal(stepNames(res), []string{StepInstall, StepRun}) {
			t.Fatalf("tarball: %s", describe(res))
		}
	})
	t.Run("needs_network", func(t *testing.T) {
		for lang, files := range map[string]map[string]string{
			"python":     {"main.py": "import requests\n", "requirements.txt": "requests\n"},
			"javascript": {"main.js": "require('left-pad')\n", "package.json": `{"name": "app", "version": "1.0.0", "dependencies": {"left-pad": "^1.3.0"}}`},
		} {
			start := time.Now()
			res, err := env.RunCode(ctx, RunCodeRequest{Language: lang, Files: files}, nil)
			if errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "network") {
				t.Errorf("%s install without network: %v", lang, err)
				if res != nil {
					t.Log(describe(res))
				}
			}
			if d := time.Since(start); d > time.Minute {
				t.Errorf("%s took %s to fail", lang, d)
			}
		}
		if ids := env.liveIDs(t); len(ids) != 0 {
			t.Fatalf("left sandboxes: %v", ids)
		}
	})
	t.Run("packages_install", func(t *testing.T) {
		info := env.create(t, CreateSandboxRequest{Language: "python"})
		whl := testenv.Wheel(t, "localpkg", "1.0", "X = 7\n")
		if _, err := env.WriteFileFrom(ctx, info.ID, "/workspace/localpkg-1.0-py3-none-any.whl", "0644", false, int64(len(whl)), bytes.NewReader(whl)); err != nil {
			t.Fatal(err)
		}
		res, err := env.PackagesInstall(ctx, PackagesInstallRequest{SandboxID: info.ID, Manager: "pip", Packages: []string{"./localpkg-1.0-py3-none-any.whl"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("pip install local wheel: %v %+v", err, res)
		}
		run := env.runCode(t, RunCodeRequest{Language: "python", SandboxID: info.ID, Code: "import localpkg\nprint(localpkg.X)\n"})
		if run.Stdout != "7\n" {
			t.Fatalf("import after packages_install: %s", describe(run))
		}
		_, err = env.PackagesInstall(ctx, PackagesInstallRequest{SandboxID: info.ID, Manager: "pip", Packages: []string{"requests"}})
		if errdefs.CodeOf(err) != errdefs.Unavailable {
			t.Errorf("pip install requests without network: %v", err)
		}
		if _, err := env.PackagesInstall(ctx, PackagesInstallRequest{SandboxID: info.ID, Manager: "apt", Packages: []string{"x"}}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("unknown manager: %v", err)
		}
	})
}

func TestRunTask(t *testing.T) {
	env := newRunEngine(t, []string{"python", "go"})
	ctx := context.Background()
	write := func(id string, files map[string]string) {
		for p, c := range files {
			if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: id, Path: "/workspace/" + p, Content: c}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("pytest", func(t *testing.T) {
		info := env.create(t, CreateSandboxRequest{Language: "python"})
		write(info.ID, map[string]string{"test_math.py": "def test_ok():\n    assert 1 + 1 == 2\n\ndef test_bad():\n    assert 1 + 1 == 3\n"})
		res, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stdout, "1 failed, 1 passed") || !strings.Contains(res.Stdout, "test_bad") {
			t.Fatalf("pytest: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
		}
		res, err = env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "lint", Path: "/workspace/test_math.py"})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("pyflakes: %v %+v", err, res)
		}
		write(info.ID, map[string]string{"bad.py": "import os\n"})
		res, err = env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "lint"})
		if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stdout, "'os' imported but unused") {
			t.Fatalf("pyflakes on bad.py: %v %+v", err, res)
		}
		if _, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "deploy"}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("unknown task: %v", err)
		}
		if _, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "test", Path: "../etc"}); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("path outside: %v", err)
		}
	})
	t.Run("go_test", func(t *testing.T) {
		info := env.create(t, CreateSandboxRequest{Language: "go"})
		write(info.ID, map[string]string{
			"go.mod":      "module example.com/calc\n\ngo 1.19\n",
			"add.go":      "package calc\n\nfunc Add(a, b int) int { return a - b }\n",
			"add_test.go": "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif got := Add(2, 2); got != 4 {\n\t\tt.Fatalf(\"Add(2, 2) = %d, want 4\", got)\n\t}\n}\n",
		})
		res, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stdout, "--- FAIL: TestAdd") || !strings.Contains(res.Stdout, "Add(2, 2) = 0, want 4") {
			t.Fatalf("go test: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
}

// TestPythonSeesASameSecondEdit is the edit-run loop every agent and the
// autofix loop go through: run the tests, fix the code, run them again. A
// Python bytecode cache keys its staleness on the source's mtime in whole
// seconds and its size, so a same-size fix written within the second of the
// first run ("a - b" to "a + b") would run the old code. The test pins the
// mtime to make that case certain rather than a matter of timing; the images
// that run Python write no bytecode (PYTHONDONTWRITEBYTECODE).
func TestPythonSeesASameSecondEdit(t *testing.T) {
	env := newRunEngine(t, []string{"python", AgentImage})
	ctx := context.Background()
	for _, img := range []string{"python", AgentImage} {
		t.Run(img, func(t *testing.T) {
			info := env.create(t, CreateSandboxRequest{Language: img})
			write := func(p, c string) {
				if _, err := env.WriteFile(ctx, FileWriteRequest{SandboxID: info.ID, Path: "/workspace/" + p, Content: c}); err != nil {
					t.Fatal(err)
				}
			}
			sh := func(script string) {
				res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: []string{"sh", "-euc", script}}, nil)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s: %v %+v", script, err, res)
				}
			}
			write("calc.py", "def add(a, b):\n    return a - b\n")
			write("test_calc.py", "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
			sh("touch -r /workspace/calc.py /tmp/calc.mtime")
			if res, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "test"}); err != nil || res.ExitCode == 0 {
				t.Fatalf("the broken code's tests: %v %+v", err, res)
			}
			write("calc.py", "def add(a, b):\n    return a + b\n")
			sh("touch -r /tmp/calc.mtime /workspace/calc.py")
			res, err := env.RunTask(ctx, RunTaskRequest{SandboxID: info.ID, Task: "test"})
			if err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "1 passed") {
				t.Fatalf("the fixed code's tests ran the old code: %v\n%s\n%s", err, res.Stdout, res.Stderr)
			}
		})
	}
}

func TestLanguages(t *testing.T) {
	env := newRunEngine(t, allLanguages)
	langs, err := env.Languages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]LanguageInfo{}
	for _, l := range langs {
		got[l.Name] = l
	}
	for _, name := range allLanguages {
		l, ok := got[name]
		if !ok {
			t.Errorf("languages_list lacks %s", name)
			continue
		}
		if !l.ImageReady || l.Version == "" || len(l.Extensions) == 0 || l.Image != name {
			t.Errorf("%s: %+v", name, l)
		}
	}
	if l := got["python"]; !slices.Equal(l.Tasks, []string{"lint", "build", "test"}) || !slices.Contains(l.Managers, "pip") {
		t.Errorf("python: %+v", l)
	}
}
