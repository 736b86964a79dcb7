// Command pause is the sandbox ("infra") container of the real test node's
// pods: it holds the pod's namespaces open by doing nothing until SIGTERM
// or SIGINT, and, as PID 1 of a pod that shares its process namespace,
// reaps orphaned children. It stands in for Kubernetes' pause image
// (registry.k8s.io/pause), which is C and built with a container
// toolchain; test/realnode packs it, built static, under that image's
// name.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
