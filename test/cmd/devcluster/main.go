// Command devcluster runs a local Kubernetes control plane for developing
// cellium: etcd and kube-apiserver on 127.0.0.1, optionally
// kube-controller-manager, started by the test harness (test/harness) as
// detached processes that keep running after the command returns.
//
//	go run ./test/cmd/devcluster up --dir .cellium-dev --node real   # make up: a real node, cellium from its chart
//	go run ./test/cmd/devcluster up --dir .cellium-dev [--controller-manager]   # the dev node (devkubelet)
//	kubectl --kubeconfig .cellium-dev/kubeconfig get ns
//	go run ./test/cmd/devcluster status --dir .cellium-dev
//	go run ./test/cmd/devcluster down --dir .cellium-dev
//	go run ./test/cmd/devcluster build   # build and cache the binaries only
//	go run ./test/cmd/devcluster build-node [--only kubernetes|containerd]   # the real node's binaries
//
// Everything lives in the directory given by --dir: certificates, etcd data,
// one log file and one pid file per process, the admin kubeconfig, and
// devcluster.json, which records what up started (in order) and marks the
// directory as devcluster's, so down never deletes a directory it did not
// create.
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
	cmd := newRootCmd()
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}
