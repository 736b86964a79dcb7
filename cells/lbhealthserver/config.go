package lbhealthserver

import (
	"net/netip"

	"github.com/spf13/pflag"
)

// Config is the health server's configuration.
type Config struct {
	// EnableHealthCheckNodePort serves the healthCheckNodePort of
	// Services with externalTrafficPolicy Local (with kube-proxy
	// replacement only).
	EnableHealthCheckNodePort bool `flag:"enable-health-check-nodeport"`
}

// DefaultConfig is on, as Cilium's.
var DefaultConfig = Config{EnableHealthCheckNodePort: true}

// Flags registers --enable-health-check-nodeport.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-health-check-nodeport", def.EnableHealthCheckNodePort,
		"Enables a healthcheck nodePort server for NodePort and LoadBalancer Services with externalTrafficPolicy Local and 'healthCheckNodePort' set (with --kube-proxy-replacement=true): 200 and the number of this node's ready endpoints, or 503 when it has none")
}

// BindAddress is the address the health servers listen on; the zero
// value (the agent's) is every address of the node. Tests provide a
// loopback address.
type BindAddress netip.Addr
