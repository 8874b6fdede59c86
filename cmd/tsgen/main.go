// Command tsgen writes the web editor's TypeScript types from pkg/apitypes
// to standard output (internal/tsgen): `go run ./cmd/tsgen >
// web/src/apitypes.gen.ts`. pkg/webui's test fails while the committed
// file differs from what it writes.
package main

import (
	"os"

	"github.com/sandboxrunner/mcp-sandboxd/internal/tsgen"
)

func main() {
	if _, err := os.Stdout.Write(tsgen.Generate(tsgen.Roots)); err != nil {
		os.Exit(1)
	}
}
