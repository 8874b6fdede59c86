package webui

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/sandboxrunner/mcp-sandboxd/internal/contract"
	"github.com/sandboxrunner/mcp-sandboxd/internal/tsgen"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// genFile is the committed TypeScript that the editor compiles against.
var genFile = filepath.Join("..", "..", "web", "src", "apitypes.gen.ts")

// TestTypeScriptTypesCurrent fails while web/src/apitypes.gen.ts differs
// from what cmd/tsgen writes from pkg/apitypes: a field added, renamed or
// dropped in the contract must reach the editor's types in the same
// commit (`go run ./cmd/tsgen > web/src/apitypes.gen.ts`).
func TestTypeScriptTypesCurrent(t *testing.T) {
	committed, err := os.ReadFile(genFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := tsgen.Generate(tsgen.Roots); !bytes.Equal(committed, want) {
		t.Fatalf("%s is stale: run `go run ./cmd/tsgen > web/src/apitypes.gen.ts`\n--- want ---\n%s", genFile, want)
	}
}

// TestTypeScriptTypesComplete: every JSON member of the editor's types is
// declared in the generated file, optional exactly when the daemon may
// leave it out (omitempty) — read from the committed file, so that a
// hand edit there fails too.
func TestTypeScriptTypesComplete(t *testing.T) {
	b, err := os.ReadFile(genFile)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for _, root := range append([]reflect.Type{reflect.TypeFor[apitypes.ExecExit](), reflect.TypeFor[apitypes.RunResult]()}, tsgen.Roots...) {
		start := strings.Index(src, "export interface "+root.Name()+" {\n")
		if start < 0 {
			t.Errorf("%s: no interface", root.Name())
			continue
		}
		body := src[start:]
		body = body[:strings.Index(body, "\n}\n")]
		for _, f := range contract.Fields(root) {
			opt := ""
			if f.OmitEmpty {
				opt = "?"
			}
			if !strings.Contains(body, "\n  "+f.Name+opt+": ") {
				t.Errorf("interface %s: no member %s%s (%s.%s)", root.Name(), f.Name, opt, root, f.GoName)
			}
		}
	}
}

// TestFiles: the bundle's files are served from dist/ as its root, and
// Built follows index.html (a clean clone has dist/.gitkeep only).
func TestFiles(t *testing.T) {
	_, statErr := os.Stat(filepath.Join("dist", "index.html"))
	if Built() != (statErr == nil) {
		t.Errorf("Built() = %v, but dist/index.html: %v", Built(), statErr)
	}
	if err := fstest.TestFS(Files(), ".gitkeep"); err != nil {
		t.Error(err)
	}
}
