// Command pause is the pod sandbox ("pause") container of the test cluster
// of make test-kubernetes: it holds the pod's namespaces and does nothing.
// Kubernetes' own pause is C; there is no registry here to pull it from, so
// this static Go one is packed by deploy/image (-pause) and imported with
// ctr. It exits on SIGTERM or SIGINT and reaps children, as PID 1 must.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
