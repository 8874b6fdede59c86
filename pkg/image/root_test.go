package image_test

import (
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// The in-package tests cannot import testenv (it imports this package); they
// reach its one root requirement through this hook.
func init() { image.RequireRoot = testenv.RequireRoot }
