//go:build tools

// This file pins the code generators that `make generate` runs with `go run`,
// so their versions come from go.mod.
package tools

import (
	_ "k8s.io/code-generator/cmd/client-gen"
	_ "k8s.io/code-generator/cmd/informer-gen"
	_ "k8s.io/code-generator/cmd/lister-gen"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"

	// Libraries pinned before their first importer lands; removed as code arrives.
	_ "github.com/cilium/ebpf"
	_ "github.com/cilium/ebpf/cmd/bpf2go"
	_ "github.com/cilium/statedb"
	_ "github.com/containernetworking/cni/libcni"
	_ "github.com/containernetworking/cni/pkg/skel"
	_ "github.com/containernetworking/plugins/pkg/ns"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "github.com/spf13/pflag"
	_ "github.com/vishvananda/netlink"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.uber.org/dig"
	_ "go.uber.org/fx"
	_ "go.uber.org/goleak"
	_ "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/leaderelection"
	_ "sigs.k8s.io/yaml"
)
