package zz

import (
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

func TestBuildAgent(t *testing.T) {
	start := time.Now()
	imgs := testenv.EnsureImages(t, "agent")
	t.Logf("agent image in %s: %+v", time.Since(start), imgs["agent"])
}
