// Command e2enetpol runs the NetworkPolicy specs of Kubernetes' own e2e
// suite ("[sig-network] Netpol", 51 specs in v1.37.2), or with --suite
// conformance sig-network's 47 conformance specs, against a cluster that
// cellium networks, and prints how many passed, failed and were
// skipped, the run time and the failed specs.
//
//	go run ./test/cmd/e2enetpol build                  # build and cache e2e.test and agnhost, pack the image
//	go run ./test/cmd/e2enetpol list [--focus RE]      # the specs a run would run and skip
//	go run ./test/cmd/e2enetpol run [--kubeconfig K] [--focus RE] [--containerd-socket S]
//	go run ./test/cmd/e2enetpol run --realnode         # on a cluster of its own with a real node (root)
//
// `make e2e-netpol` is `run` against `make up`'s cluster
// (.cellium-dev/kubeconfig); `make e2e-netpol-realnode` is `run
// --realnode`; `make e2e-conformance` is `run --suite conformance`.
// Documentation/contributing/e2e-netpol.md and e2e-conformance.md have the
// details.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2enetpol:", err)
		os.Exit(1)
	}
}
