// Command coredns is CoreDNS (github.com/coredns/coredns) with the plugins
// of the Corefile that kubeadm installs for cluster DNS, for the real node
// of cellium's test harness (test/realnode packs it as the
// registry.k8s.io/coredns/coredns image). Upstream's binary links every
// plugin (core/plugin); the cloud back-ends (route53, azure, clouddns),
// etcd and the others are left out here, which only shortens the build: the
// server, the plugins and their order (dnsserver.Directives) are
// upstream's.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins of kubeadm's Corefile (errors, health, ready, kubernetes,
	// prometheus, forward, cache, loop, reload, loadbalance) and a few that
	// are useful to debug it (log, debug, whoami, template) or to run it
	// outside a pod (bind).
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func main() {
	coremain.Run()
}
