package mcpserver

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestVMCreateProgress: sandbox_create {backend: vm} sends the engine's
// progress lines as progress notifications. Here the line of a disk guest booting (a
// vm.images.windows that is no Windows: the guest never answers, and the
// call ends in the vm.boot_timeout error after the notification); the
// first-use build of a guest image goes the same way.
func TestVMCreateProgress(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "not-windows.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	e := newEngine(t, func(c *config.Config) {
		c.VM.Images = map[string]string{"windows": disk}
		c.VM.BootTimeout = config.Duration(5 * time.Second)
	})
	c := newClient(t, e, Options{})
	res := c.call("sandbox_create", map[string]any{"backend": "vm", "os": "windows"}, &mcp.Meta{ProgressToken: "vm1"})
	if !res.IsError || !strings.Contains(text(res), "vm.boot_timeout") {
		t.Errorf("sandbox_create {backend: vm} of a guest that never answers: %s", text(res))
	}
	var msgs []string
	for _, n := range c.notifications() {
		if n.Method == "notifications/progress" && n.Params.AdditionalFields["progressToken"] == "vm1" {
			m, _ := n.Params.AdditionalFields["message"].(string)
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 || !strings.HasPrefix(msgs[0], "booting windows from "+disk) {
		t.Errorf("progress notifications: %q", msgs)
	}
}
